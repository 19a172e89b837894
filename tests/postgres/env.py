"""One test's PostgreSQL queue for the real commands: like the SQLite ``Env`` (tests/conftest.py),
but every ``jobq-ctl`` and ``jobq-supervisor`` talks to the test's database (``pg_url``)
through ``JOBQ_POSTGRES_URL``, and ``rows``/``job`` read the jobs table."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg

from supervisor.backends.postgres.lease import PostgresLease
from supervisor.core.settings import Settings
from tests.conftest import Env


class PgEnv(Env):
    def __init__(self, tmp: Path, url: str, queue: str = "default",
                 notify: str | None = None) -> None:
        """``notify``: the ``--postgres-notify`` both commands get (None: their default)."""
        super().__init__(tmp)
        self.url = url
        self.queue = queue
        self.notify = notify

    def base_args(self) -> list[str]:
        notify = ["--postgres-notify", self.notify] if self.notify else []
        return ["--backend", "postgres", "--queue", self.queue, *notify]

    def _settings(self) -> dict[str, str]:
        return {"postgres_notify": self.notify} if self.notify else {}

    def secret_env(self) -> dict[str, str]:
        return {"JOBQ_POSTGRES_URL": self.url}

    def settings(self, **kw) -> Settings:
        return Settings(backend="postgres", postgres_url=self.url, queue=self.queue,
                        **self._settings(), **kw)

    def state(self, task_id: str) -> str | None:
        return self.job(task_id).get("state")

    def serve(self, queue: str | None = None) -> None:
        """Record the queue as served, as a worker's start does (no "never served" warning)."""
        from tests.postgres.queue import open_queue

        open_queue(self.url, queue or self.queue, "test-worker", **self._settings()).close()

    @contextmanager
    def lease_of(self, task_id: str) -> Iterator[PostgresLease]:
        """The lease of task ``task_id``, received as a worker would (the others received
        with it go back untouched)."""
        from tests.postgres.queue import open_queue

        backend = open_queue(self.url, self.queue, "test-worker", **self._settings())
        try:
            leases = backend.receive(100, 60.0)
            for lease in leases:
                if lease.message_id != task_id:
                    lease.release(count_attempt=False)
            [mine] = [lease for lease in leases if lease.message_id == task_id]
            yield mine
        finally:
            backend.close()

    def rows(self, sql: str = "SELECT id, state, attempt, reason FROM jobq.jobs "
             "ORDER BY created_at, run_at, id", args: tuple = ()) -> list[tuple]:
        with psycopg.connect(self.url, autocommit=True) as conn:
            return conn.execute(sql, args).fetchall()

    def job(self, task_id: str) -> dict:
        with psycopg.connect(self.url, autocommit=True) as conn:
            cur = conn.execute("SELECT * FROM jobq.jobs WHERE id=%s", (task_id,))
            row = cur.fetchone()
            names = [d.name for d in cur.description or ()]
        return dict(zip(names, row)) if row else {}

