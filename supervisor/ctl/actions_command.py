"""The audit log from ``jobq-ctl``'s side (main thread): ``note_action``, which every command
that acts on the fleet or the queue's tasks (cancel, pause, resume, drain, stop, requeue,
clear, prune) calls once its action is done, and ``jobq-ctl actions [--limit N] [--json]``,
which lists the newest actions -- jobq-ctl's and the dashboard's -- from the control store.
What a record holds and how it is worded: ops/audit.py.

Recording fails soft: a control store that is down (or refuses the write) costs one warning
line on stderr and never the action's exit status; a command without a control store
(``--control off``) records nothing and says nothing of it.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING

from ..core.options import UsageError

if TYPE_CHECKING:
    from ..fleet.control.base import ControlStore

DEFAULT_LIMIT = 20
MAX_LIMIT = 1000


def note_action(ns: argparse.Namespace, store: ControlStore | None, action: str,
                detail: str) -> None:
    """Record one action of this command (signed with the first --signing-key-file); a
    store error is a warning, never the command's failure."""
    if store is None:
        return
    # here, not at the top: the parser's --help imports this module for its arguments
    from ..fleet.control.base import ControlStoreError
    from ..ops.audit import VIA_CTL, record_action
    from ..ops.fleet import who
    from ..ops.keys import first_key

    try:
        record_action(store, ns.queue, action, detail, who(), VIA_CTL, first_key(ns))
    except ControlStoreError as exc:
        print(f"jobq-ctl: warning: {action} done, but not kept in the audit log: {exc}",
              file=sys.stderr)


def add_actions_arguments(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("--limit", type=int, default=DEFAULT_LIMIT, metavar="N",
                    help=f"the newest N actions (default {DEFAULT_LIMIT}, at most {MAX_LIMIT})")
    sp.add_argument("--json", action="store_true",
                    help="print JSON: a list, newest first (each signature checked against "
                         "the --signing-key-file keys when given)")


def cmd_actions(ns: argparse.Namespace, store: ControlStore) -> int:
    """``jobq-ctl actions``: read-only; a store that cannot be reached is exit 1 (main)."""
    if not 1 <= ns.limit <= MAX_LIMIT:
        raise UsageError(f"--limit: 1 to {MAX_LIMIT}")
    from ..core.signing import SecurityConfigError, load_keys
    from ..ops.audit import actions_json

    try:  # given keys: each signature is checked against them
        keys = load_keys(getattr(ns, "signing_key_file", None))
    except SecurityConfigError as exc:
        raise UsageError(str(exc)) from None
    rows = actions_json(store.audits(ns.queue, ns.limit), keys)
    if ns.json:
        print(json.dumps(rows, indent=2))
        return 0
    if not rows:
        print(f"no operator actions recorded on queue {ns.queue} (kept 90 days)")
        return 0
    print(f"{'WHEN':20}  {'WHO':30} {'VIA':9} {'ACTION':8} DETAIL")
    for r in rows:
        signed = f"  [signed, {r['signature']}]" if r["signature"] else ""
        print(f"{r['when'] or '-':20}  {r['who']:30} {r['via']:9} {r['action']:8} "
              f"{r['detail']}{signed}".rstrip())
    return 0
