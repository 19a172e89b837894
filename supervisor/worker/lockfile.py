"""--lock-file: one run at a time (cron starts the next run while one is still alive)."""

from __future__ import annotations

import fcntl
import os


class AlreadyRunning(Exception):
    """Another process holds the lock file."""


def acquire(path: str) -> int:
    """Take an exclusive flock on ``path`` for the life of the process (main thread).

    Returns the file descriptor (keep it open).  Raises AlreadyRunning when another run holds
    it, OSError when the file cannot be opened.  The descriptor is not inheritable, so tasks
    never keep the lock alive after the supervisor is gone.
    """
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise AlreadyRunning(path) from None
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    return fd
