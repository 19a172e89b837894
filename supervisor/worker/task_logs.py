"""The ``--task-log-dir`` files: their names, which of them are in use, and their purge.

Each attempt's output goes to ``DIR/<task id>.<attempt>.log`` (the id with every character
but letters, digits, ``_`` and ``-`` made ``_``, cut to 128).  Without a purge the directory
grew for ever (issue 40), so a thread of its own ("task-log-purge", niced like the other
threads that move output) deletes the files last modified longer than
``--task-output-retention`` ago, the retention of the output store: PURGE_FIRST seconds after
start, then every PURGE_EVERY, as the output store's purge.  Not on the output-store thread:
that one exists only with a store, and task logs are written without one.

Only regular files whose names this module makes are deleted, never what an operator put
beside them, and never the file of an attempt running here however old (a task silent for a
week): ``claim`` marks it in use before the pump opens it, ``release`` once the pump closed
it, and the purge checks and deletes under the same lock, so a rerun that appends to an old
file of the same name either finds it deleted (and starts a new one) or keeps it.  Workers
that share the directory delete each other's old files (same retention); one that vanished
meanwhile is no error.  A pass deletes in batches of BATCH with a pause between them, and
logs what failed (permission denied, an unreadable directory) in one line per pass.
"""

from __future__ import annotations

import collections
import logging
import os
import re
import stat
import threading
import time
from typing import Callable, Union

from ..core.settings import format_duration
from ..core.threads import start_thread

log = logging.getLogger("jobq.worker")

PURGE_FIRST = 5.0  # s after start: not while the first tasks start (as the output store)
PURGE_EVERY = 3600.0
BATCH = 200  # files deleted (or 10x as many names looked at) between two pauses
BATCH_PAUSE = 0.2  # s
STOP_WAIT = 1.0  # s a pass in progress is waited for at exit (a daemon thread)
NAME = re.compile(r"[A-Za-z0-9_-]{1,128}\.[0-9]+\.log")


def log_name(task_id: str, attempt: int) -> str:
    """The file name of an attempt's log: the id comes from the message, so it may never
    name a path outside the directory (any thread)."""
    return f"{re.sub(r'[^A-Za-z0-9_-]', '_', task_id)[:128] or '_'}.{attempt}.log"


class TaskLogDir:
    """``claim`` is called by the spawner threads (the main thread if that failed),
    ``release`` by the pump thread, ``start``/``stop`` by the main thread; ``purge`` runs
    on the purge thread (or a test's)."""

    def __init__(self, path: str, retention: float, *,
                 clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time,
                 first: float = PURGE_FIRST, every: float = PURGE_EVERY) -> None:
        self.path = path
        self.retention = retention  # s; 0 or less: kept for ever
        self.clock, self.wall = clock, wall  # monotonic for the schedule, wall for mtimes
        self.first, self.every = first, every
        self.passes = 0  # finished purge passes (tests wait on it)
        self._in_use: collections.Counter[str] = collections.Counter()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: Union[threading.Thread, None] = None

    # -- spawner and pump threads --------------------------------------------------------
    def claim(self, task_id: str, attempt: int) -> str:
        """The attempt's log file, kept from the purge until ``release`` (a spawner
        thread)."""
        name = log_name(task_id, attempt)
        with self._lock:
            self._in_use[name] += 1
        return os.path.join(self.path, name)

    def release(self, path: str) -> None:
        """The pump closed the file: the purge may delete it once it is old (pump
        thread)."""
        name = os.path.basename(path)
        with self._lock:
            self._in_use[name] -= 1
            if self._in_use[name] <= 0:
                del self._in_use[name]

    # -- main thread ---------------------------------------------------------------------
    def start(self) -> None:
        """Start the purge thread, unless retention 0 keeps every file (main thread)."""
        if self.retention > 0:
            self._thread = start_thread(self._run, "task-log-purge", bulk=True)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(STOP_WAIT)

    # -- purge thread --------------------------------------------------------------------
    def _run(self) -> None:
        wait = self.first
        while not self._stop.wait(wait):
            started = self.clock()
            try:
                self.purge()
            except Exception:  # a bug: log it, try again next time
                log.exception("task-log-dir: unexpected error in the purge")
            wait = max(0.0, started + self.every - self.clock())

    def purge(self) -> int:
        """One pass: delete this worker's kind of file older than the retention, but none in
        use; how many were deleted (purge thread)."""
        if self.retention <= 0:
            return 0
        cutoff = self.wall() - self.retention
        deleted = failed = looked = 0
        first_error = unreadable = ""
        try:
            with os.scandir(self.path) as entries:
                for entry in entries:
                    if self._stop.is_set():
                        break
                    looked += 1
                    outcome = (self._delete_if_old(entry.path, entry.name, cutoff)
                               if NAME.fullmatch(entry.name) else False)
                    if outcome is True:
                        deleted += 1
                    elif outcome:
                        failed += 1
                        first_error = first_error or outcome
                    if (outcome is True and deleted % BATCH == 0) or looked % (10 * BATCH) == 0:
                        self._stop.wait(BATCH_PAUSE)  # a big backlog: in batches
        except OSError as exc:  # the directory itself (gone, not readable)
            unreadable = f"cannot read {self.path}: {exc.strerror or exc}"
        age = format_duration(self.retention)
        if deleted:
            log.info("task-log-dir: deleted %d task log(s) older than %s", deleted, age)
        if failed or unreadable:
            problems = [unreadable] if unreadable else []
            if failed:
                problems.append(f"could not delete {failed} task log(s) older than {age} "
                                f"(first: {first_error})")
            log.warning("task-log-dir: %s; tried again in %s", "; ".join(problems),
                        format_duration(self.every))
        self.passes += 1
        return deleted

    def _delete_if_old(self, path: str, name: str, cutoff: float) -> Union[bool, str]:
        """True if deleted, False if kept, else why it could not be (purge thread)."""
        with self._lock:  # a claim of this name waits: never appends to an unlinked file
            if name in self._in_use:
                return False
            try:
                st = os.lstat(path)  # now, not at the scan: another worker may write it
                if not stat.S_ISREG(st.st_mode) or st.st_mtime >= cutoff:
                    return False  # young, or not a file we make (a symlink, a directory)
                os.unlink(path)
            except FileNotFoundError:
                return False  # another worker sharing the directory deleted it first
            except OSError as exc:
                return f"{path}: {exc.strerror or exc}"
        return True
