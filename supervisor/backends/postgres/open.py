"""Opening the PostgreSQL queue (``open_backend``'s branch, backends/__init__.py): the two
pools, the schema check, the backend (main thread).

A worker and a writing ``jobq-ctl`` create the schema where it is missing and their role may
(schema.check_schema); the read-only commands (``create=False``) create nothing, and a
database without the schema is "does not exist" for them (exit 1, as a missing SQLite file).
"""

from __future__ import annotations

from ...core.settings import Settings
from .backend import PostgresBackend
from .connect import open_pools
from .db import Database
from .schema import check_schema


def open_postgres(settings: Settings, for_ctl: bool = False,
                  create: bool = True) -> PostgresBackend:
    """The backend of ``settings.queue`` (one queue: backends/multi.py opens one each).
    Raises BackendConfigError (exit 2), QueueNotFound or BackendError."""
    pools = open_pools(settings, for_ctl=for_ctl)
    try:
        db = Database(pools, settings.postgres_schema)
        with db.main("schema check") as conn:
            check_schema(conn, settings.postgres_schema, create, settings.postgres_url)
        return PostgresBackend(db, settings.queue, settings.worker_id,
                               retention=settings.retention,
                               reaper_interval=settings.reaper_interval,
                               serve=not for_ctl)
    except BaseException:
        pools.close()
        raise
