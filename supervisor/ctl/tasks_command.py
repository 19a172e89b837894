"""``jobq-ctl tasks``: a page of the queue's tasks, newest first (ops/task_list.py), as lines
or ``--json``; the cursor of the next page on stderr (main thread)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING

from ..backends.base import Backend
from ..backends.task_list import MAX_PAGE, PAGE, TASK_STATES, BadCursor, TaskQuery, next_cursor
from ..core.options import UsageError
from ..ops.times import iso

if TYPE_CHECKING:
    from ..fleet.control.base import ControlStore

CMD_SHOWN = 60  # characters of a command on a line
RESULT_SHOWN = 24  # ... of the exit status or reason ("exit 3", "cancelled by ...")


def _result(exit_status: int | None, reason: str | None) -> str:
    """``exit 3``, else the reason's start, else ``-`` (a task that has not ended)."""
    if exit_status is not None:
        return f"exit {exit_status}"
    if not reason:
        return "-"
    return reason if len(reason) <= RESULT_SHOWN else reason[:RESULT_SHOWN - 3] + "..."


def add_tasks_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--state", default="", metavar="STATE[,STATE]",
                   help=f"only tasks in these states ({', '.join(TASK_STATES)})")
    p.add_argument("--worker", default=None, metavar="WORKER",
                   help="only tasks this worker runs or ended")
    p.add_argument("--grep", default=None, metavar="TEXT",
                   help="only tasks whose command contains TEXT")
    p.add_argument("--limit", type=int, default=PAGE, metavar="N",
                   help=f"at most N tasks (default {PAGE}, at most {MAX_PAGE})")
    p.add_argument("--after", default=None, metavar="CURSOR",
                   help="the page after this cursor (printed on stderr after a full page)")
    p.add_argument("--json", action="store_true",
                   help='print JSON: {"tasks": [...], "next": CURSOR or null, "note": ...}')


def cmd_tasks(ns: argparse.Namespace, backend: Backend, store: ControlStore | None) -> int:
    # here, not above: main.py imports this module for add_tasks_arguments at every start-up,
    # and the listing imports the control records (ctl/commands.py)
    from ..ops.task_list import list_tasks, parse_states, row_json

    try:
        states = parse_states(ns.state)
    except ValueError as exc:
        raise UsageError(f"tasks: --state: {exc}") from None
    if not 1 <= ns.limit <= MAX_PAGE:
        raise UsageError(f"tasks: --limit: from 1 to {MAX_PAGE}")
    query = TaskQuery(states=states, worker=ns.worker, text=ns.grep or None,
                      cursor=ns.after, limit=ns.limit)
    try:
        rows, note = list_tasks(backend, store, ns.queue, query)
    except BadCursor as exc:
        raise UsageError(f"tasks: --after: {exc}") from None
    after = next_cursor(rows, query)
    if ns.json:
        print(json.dumps({"tasks": [row_json(r) for r in rows], "next": after, "note": note},
                         indent=2))
        return 0
    if note:
        print(f"jobq-ctl: note: {note}", file=sys.stderr)
    if rows:
        print(f"{'ID':32}  {'STATE':9}  {'ATT':>3}  {'PUSHED':20}  {'ENDED':20}  "
              f"{'WORKER':20}  {'RESULT':{RESULT_SHOWN}}  COMMAND")
    for r in rows:
        cmd = r.cmd if len(r.cmd) <= CMD_SHOWN else r.cmd[:CMD_SHOWN - 3] + "..."
        ended = iso(r.ended) if r.ended is not None else "-"
        print(f"{r.id}  {r.state:9}  {r.attempt:>3}  {iso(r.created):20}  {ended:20}  "
              f"{r.worker or '-':20}  {_result(r.exit_status, r.reason):{RESULT_SHOWN}}  {cmd}")
    if after is not None:
        print(f"jobq-ctl: more: the same command with --after '{after}'", file=sys.stderr)
    return 0
