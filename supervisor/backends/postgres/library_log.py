"""psycopg's and psycopg_pool's own log records made like ours: one line each, no password,
and not one per retry.

While the server is down, psycopg_pool logs ``error connecting in 'jobq-main': ...`` at each
reconnect attempt of each pool -- every few hundred milliseconds at times -- with libpq's
message as it is: several lines ("connection refused" and a tab-indented hint), which in a
text log look like a traceback and split one record over lines a log shipper takes apart.
``LibraryLogFilter`` (installed on psycopg's and psycopg_pool's loggers by connect.py,
which hands in its ``redact``) rewrites each record's message as one redacted
line (an attached exception: its one-line text after it, no traceback), and lets the same
message of the same pool through once per ``REPEAT_EVERY`` seconds, the next one saying how
many were held back.  The worker's own outage lines (core/backoff.py) say what the outage
means for the tasks; these only add the driver's detail.

Called on whichever thread logs (a pool's worker threads, the lease threads, the main
thread): the state is under a lock.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Hashable

REPEAT_EVERY = 30.0  # s: the same message of a logger (and pool) at most once per this


class LibraryLogFilter(logging.Filter):
    """``redact``: a text without passwords (connect.py); ``clock``: monotonic (tests
    inject one)."""

    def __init__(self, redact: Callable[[str], str], clock: Callable[[], float] = time.monotonic,
                 every: float = REPEAT_EVERY) -> None:
        super().__init__()
        self.redact = redact
        self.clock = clock
        self.every = every
        self._lock = threading.Lock()
        self._seen: dict[Hashable, tuple[float, int]] = {}  # key -> (logged at, held back)

    def filter(self, record: logging.LogRecord) -> bool:
        key = _key(record)
        now = self.clock()
        with self._lock:
            logged_at, held = self._seen.get(key, (-float("inf"), 0))
            if now - logged_at < self.every:
                self._seen[key] = (logged_at, held + 1)
                return False
            self._seen[key] = (now, 0)
        text = record.getMessage()
        exc = record.exc_info[1] if record.exc_info else None
        if exc is not None:
            text = f"{text}: {type(exc).__name__}: {exc}"
        elif record.exc_text:
            text = f"{text}: {record.exc_text.strip().splitlines()[-1]}"
        text = " ".join(self.redact(text).split())
        if held:
            text += f" ({held} more like it in the last {now - logged_at:.0f}s)"
        record.msg, record.args = text, None
        record.exc_info, record.exc_text, record.stack_info = None, None, None
        return True


def _key(record: logging.LogRecord) -> Hashable:
    """What makes two records "the same message": the logger, the format string, and its
    first argument when that is a text (psycopg_pool's pool name)."""
    first = record.args[0] if isinstance(record.args, tuple) and record.args else None
    return record.name, str(record.msg), first if isinstance(first, str) else None


def tame(packages: tuple[str, ...], redact: Callable[[str], str]) -> None:
    """Install the filter on every logger of ``packages`` (at import of connect.py, once,
    after the packages were imported): a logger's filter sees only the records logged on
    that logger, not its children's (``psycopg.pq``, ``psycopg_pool.sched``...)."""
    flt = LibraryLogFilter(redact)
    known = list(logging.Logger.manager.loggerDict)
    for name in {*packages, *(n for n in known for p in packages if n.startswith(p + "."))}:
        logging.getLogger(name).addFilter(flt)
