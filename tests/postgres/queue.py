"""Opening a PostgreSQL queue in a test as the commands open it: ``open_backend`` with the
settings a worker (or, ``for_ctl``, a jobq-ctl) would have."""

from __future__ import annotations

from supervisor.backends import open_backend
from supervisor.backends.postgres.backend import PostgresBackend
from supervisor.core.settings import Settings


def queue_settings(url: str, queue: str = "jobs", worker: str = "w1", **kw) -> Settings:
    return Settings(backend="postgres", postgres_url=url, queue=queue, worker_id=worker,
                    num_workers=kw.pop("num_workers", 4), **kw)


def open_queue(url: str, queue: str = "jobs", worker: str = "w1", *, for_ctl: bool = False,
               create: bool = True, **kw) -> PostgresBackend:
    """A backend on ``queue`` of the database at ``url`` (the schema made where missing)."""
    backend = open_backend(queue_settings(url, queue, worker, **kw), for_ctl=for_ctl,
                           create=create)
    assert isinstance(backend, PostgresBackend)
    return backend
