"""The modes of what jobq creates: private to its user (umask 077: files 0600, directories
0700) -- the SQLite queue (whose tasks' env may hold keys), the output store, task logs, the
lock file -- or readable by its group on purpose (``--group-readable``: umask 027, 0640 and
0750).  The tasks keep the umask the command was started with (or ``--task-umask``): a task's
files are its own business.

The umask is the process's, shared by all its threads, so the task's cannot be set around a
spawn without our other threads creating files under it meanwhile.  Instead each spawner
thread gets a filesystem context of its own (``unshare(CLONE_FS)``: its own umask and working
directory) and switches its own umask around each spawn; posix_spawn's and fork's child copy
the calling thread's.  Two umask calls a spawn, ~1 us.

Who calls: ``restrict`` the entry points (worker/main.py ``worker_entry``, ctl/main.py
``ctl_entry``; main thread, before any thread starts); ``configure`` worker/main.py and
ctl/main.py once the options are read (main thread); ``SpawnUmask`` the spawner threads
(worker/spawner.py).  The metrics file is meant for node_exporter, another user: it is made
0644 where it is written (worker/metrics.py).
"""

from __future__ import annotations

import logging
import os

log = logging.getLogger("jobq")

PRIVATE = 0o077
GROUP_READABLE = 0o027
_CLONE_FS = 0x200

_inherited: int | None = None  # the umask the command was started with; None: not restricted
_task: int | None = None  # --task-umask


def restrict() -> None:
    """Umask 077 for everything the process creates from now on (main thread, first thing)."""
    global _inherited
    old = os.umask(PRIVATE)
    if _inherited is None:
        _inherited = old


def configure(group_readable: bool, task_umask: int | None = None) -> None:
    """The options' say (main thread): ``--group-readable`` turns the umask 077 that
    ``restrict`` set into 027; ``--task-umask`` is what the tasks get instead of the inherited
    umask."""
    global _task
    if _inherited is not None:
        os.umask(GROUP_READABLE if group_readable else PRIVATE)
    _task = task_umask


def task_umask() -> int | None:
    """The umask a task's shell starts with, or None: the process's own, nothing to switch."""
    return _task if _task is not None else _inherited


def _unshare_fs(wanted: int) -> bool:
    """Give the calling thread its own umask and working directory (a spawner thread)."""
    import ctypes  # here: jobq-ctl, which starts no task, never pays for the import

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.unshare(_CLONE_FS) == 0:
            return True
        problem = os.strerror(ctypes.get_errno())
    except (OSError, AttributeError) as exc:
        problem = str(exc)
    log.warning("tasks start with the supervisor's own umask, not %04o: unshare(CLONE_FS): %s",
                wanted, problem)
    return False


class SpawnUmask:
    """A spawner thread's switch between its own umask and the task's (that thread only)."""

    __slots__ = ("ours", "task")

    def __init__(self) -> None:
        """Called on the spawner thread itself, once, before its first spawn."""
        self.ours: int | None = None
        self.task = task_umask()
        if self.task is None or not _unshare_fs(self.task):
            self.task = None
            return
        self.ours = os.umask(self.task)  # this thread's only, now
        os.umask(self.ours)
        if self.ours == self.task:
            self.task = None

    def __enter__(self) -> None:
        if self.task is not None:
            os.umask(self.task)

    def __exit__(self, *exc: object) -> None:
        if self.ours is not None and self.task is not None:
            os.umask(self.ours)
