"""``PgEnv``: one test's queue on the session's PostgreSQL server (a database of its own,
``pg_url``), like the SQLite Env and Azurite's SqEnv: both commands configured for it (the
URL in JOBQ_POSTGRES_URL, not on a command line), and the test's own queries on its
tables."""

from __future__ import annotations

import os
import subprocess
from typing import Any

import psycopg
from psycopg.rows import dict_row

from tests.conftest import Env, Supervisor, command
from tests.postgres.faults import SCHEMA, through
from tests.postgres.server import PgServer


class PgEnv(Env):
    def __init__(self, tmp, server: PgServer, url: str) -> None:
        super().__init__(tmp)
        self.server = server
        self.url = url

    def base_args(self) -> list[str]:
        return ["--backend", "postgres"]

    def secret_env(self, port: int | None = None) -> dict[str, str]:
        """The URL for the commands' environment; through ``port`` on 127.0.0.1 if given
        (a FaultProxy's)."""
        return {"JOBQ_POSTGRES_URL": through(self.url, port) if port else self.url}

    def ctl(self, *args: str, check: bool = True, input: str | None = None,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        full = dict(os.environ)
        full.update(self.secret_env())
        full.update(env or {})
        res = subprocess.run(command("jobq-ctl") + self.base_args() + list(args),
                             capture_output=True, text=True, timeout=60, input=input,
                             env=full, cwd=self.tmp)
        if check and res.returncode != 0:
            raise AssertionError(f"jobq-ctl {args} failed: {res.stderr}")
        return res

    def supervisor(self, *args: str, env: dict[str, str] | None = None,
                   via_port: int | None = None, **kw: Any) -> Supervisor:
        full = self.secret_env(via_port)
        full.update(env or {})
        return super().supervisor(*args, env=full, **kw)

    def rows(self, sql: str = f"SELECT id, state, attempt, reason FROM {SCHEMA}.jobs "
                              "ORDER BY created_at, id",
             args: tuple = ()) -> list[tuple]:
        with psycopg.connect(self.url, autocommit=True, connect_timeout=10) as conn:
            return conn.execute(sql, args).fetchall()  # type: ignore[arg-type]

    def job(self, task_id: str) -> dict:
        with psycopg.connect(self.url, autocommit=True, connect_timeout=10,
                             row_factory=dict_row) as conn:
            row = conn.execute(f"SELECT * FROM {SCHEMA}.jobs WHERE id=%s",
                               (task_id,)).fetchone()
        return dict(row) if row else {}
