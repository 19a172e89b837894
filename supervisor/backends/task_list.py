"""Listing a queue's tasks for an operator (``jobq-ctl tasks``, the dashboard's tasks page):
the query and the row every queue that indexes its tasks answers with
(``QueueAdmin.list_tasks``; backends/sqlite/task_list.py, backends/postgres/task_list.py).

Newest first, a page at a time by keyset: a page's ``cursor`` is where the next one starts, so
page 500 costs what page 1 costs (an OFFSET would read every row before it).  The caller's
thread.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Union

from ..core.task import Task, TaskFormatError

# What a listing can ask for: pending waits for a worker; delayed waits for its --delay or a
# retry's back-off; cancelled is a failed task whose reason says so.
TASK_STATES = ("pending", "delayed", "running", "succeeded", "failed", "cancelled")
PAGE = 100  # rows a page shows unless asked otherwise
MAX_PAGE = 1000


@dataclass(frozen=True)
class TaskQuery:
    """Which tasks: any of ``states`` (all when empty), run or ended by ``worker``, with
    ``text`` in the command; after ``cursor`` (a previous page's), at most ``limit``."""

    states: tuple[str, ...] = ()
    worker: Union[str, None] = None
    text: Union[str, None] = None
    cursor: Union[str, None] = None
    limit: int = PAGE


@dataclass(frozen=True)
class TaskRow:
    """One task of a listing (times: wall-clock epoch seconds)."""

    id: str
    state: str  # one of TASK_STATES
    attempt: int
    max_attempts: Union[int, None]
    cmd: str
    created: float
    ended: Union[float, None]
    worker: Union[str, None]  # running it, or the one that ended it
    reason: Union[str, None]
    exit_status: Union[int, None]
    cursor: str  # the next page after this row starts here


class BadCursor(ValueError):
    """A cursor no page of this listing printed (jobq-ctl: exit 2; the dashboard: 400)."""

    def __init__(self, cursor: str) -> None:
        super().__init__(f"{cursor[:60]!r} is not a cursor a page of this queue printed")


def next_cursor(rows: list[TaskRow], query: TaskQuery) -> Union[str, None]:
    """Where the page after ``rows`` starts; None when ``rows`` is the last page."""
    return rows[-1].cursor if rows and len(rows) == query.limit else None


def command_of(body: str) -> str:
    try:
        return Task.parse(body).cmd
    except TaskFormatError:
        return "(invalid body)"


def text_clause(text: str, test: str) -> tuple[str, list[str]]:
    """(the WHERE part that finds ``text`` in a body, its arguments): ``test`` is the
    driver's one-pattern test (``body LIKE ? ESCAPE '\\'``), OR-ed over like_patterns."""
    patterns = like_patterns(text)
    return "(" + " OR ".join([test] * len(patterns)) + ")", patterns


def like_patterns(text: str) -> list[str]:
    """LIKE patterns (ESCAPE '\\') that find ``text`` in a message body as JSON writes it:
    quotes and backslashes escaped, non-ASCII characters escaped (jobq-ctl, ai4s-jobq) or
    not (another producer), and twice in an envelope.  A body matching any is listed."""
    once = [json.dumps(text)[1:-1], json.dumps(text, ensure_ascii=False)[1:-1]]
    # an envelope's kwargs are JSON in a JSON string: escaped twice
    forms = dict.fromkeys(once + [json.dumps(f, ensure_ascii=a)[1:-1]
                                  for f, a in zip(once, (True, False))])
    return ["%" + f.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
            for f in forms]
