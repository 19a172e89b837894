"""``jobq-supervisor --check-config``: would a worker with these settings start?

What scripts/install-service runs as the service's user after an upgrade, before the operator
restarts the service, so that a setting the new build refuses (or a queue file the service's
user cannot write) is found while the old worker still runs, not by a unit that stopped
restarting.  It checks what start-up checks before it opens the queue: the settings, the
security options (keys readable), the task log directory (created, as start-up does), the
output store option; and, for SQLite, that this user may write the database (or create it).
No queue is opened and no network call is made.
"""

from __future__ import annotations

import os

from ..core.settings import Settings


def sqlite_problem(path: str) -> str | None:
    """The one-line reason this user cannot use the SQLite queue at ``path``, or None (main
    thread).  SQLite in WAL mode writes the -wal and -shm files beside the database, so the
    directory must be writable too, not only the file."""
    directory = os.path.dirname(os.path.abspath(path)) or "/"
    user = f"this user (uid {os.geteuid()})"
    try:
        os.stat(path)
    except FileNotFoundError:
        if not os.path.isdir(directory):
            return f"--sqlite-path: the directory of {path} does not exist"
    except PermissionError:
        return f"--sqlite-path: {path} cannot be reached by {user}: a directory above it is closed"
    else:
        if not os.access(path, os.R_OK | os.W_OK):
            return f"--sqlite-path: {path} cannot be written by {user}"
    if not os.access(directory, os.W_OK | os.X_OK):
        return (f"--sqlite-path: {directory} cannot be written by {user}: SQLite keeps its "
                f"-wal and -shm files there")
    return None


def backend_problem(settings: Settings) -> str | None:
    """What start-up would refuse about the queue itself, without opening it (main thread)."""
    if settings.backend == "sqlite":
        return sqlite_problem(settings.sqlite_path)
    return None


def summary(settings: Settings) -> str:
    """The line printed when the configuration passes (main thread)."""
    where = {"sqlite": os.path.abspath(settings.sqlite_path), "postgres": "PostgreSQL",
             "storage-queue": "Storage Queue", "servicebus": "Service Bus"}[settings.backend]
    return (f"jobq-supervisor: configuration OK: backend {settings.backend} ({where}), "
            f"queue {settings.queue}, {settings.num_workers} slot(s)")
