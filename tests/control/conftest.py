"""Every control store behind one fixture: SQLite in a real queue database file, Azure Table
Storage on Azurite's table service (started once per session on a free loopback port), and
PostgreSQL in a fresh database of the session's real server (``pg_url``, tests/conftest.py).

The Azurite binary is $AZURITE_TABLE_BIN, else ``azurite-table`` beside $AZURITE_QUEUE_BIN,
else <repo>/.azurite/node_modules/.bin/azurite-table.  It keeps everything in memory, runs
from an empty temporary directory and is killed by its PID (process group).
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import pytest

from supervisor.backends.sqlite.backend import SqliteBackend
from supervisor.fleet.control.base import ControlStore
from supervisor.fleet.control.sqlite import SqliteControlStore
from tests import ctl_server
from tests.azurite import (  # noqa: F401 (re-exported)
    ACCOUNT,
    ACCOUNT_KEY,
    azurite_service,
    free_port,
    session_service,
    table_connection_string,
)
from tests.conftest import command

QUEUE = "jobs"


@dataclass
class Kit:
    """A store under test, plus what a test needs to reach past it."""

    kind: str
    store: ControlStore
    make: Callable[..., ControlStore]  # another instance on the same storage
    raw_put: Callable[[str, str, dict[str, Any]], None]  # (part, row, columns) unchecked
    calls: list[str] = field(default_factory=list)  # HTTP requests / SQL statements


def _sqlite_kit(tmp_path: Path) -> Iterator[Kit]:
    path = str(tmp_path / "queue.db")
    backend = SqliteBackend(path, QUEUE, "test-worker")  # the queue's own tables come first
    calls: list[str] = []
    store = SqliteControlStore(path)
    store._conn.set_trace_callback(calls.append)

    def raw_put(part: str, row: str, cols: dict[str, Any]) -> None:
        with sqlite3.connect(path) as conn:
            conn.execute("INSERT OR REPLACE INTO control_records (part, row, kind, at, rev, doc)"
                         " VALUES (?,?,?,?,(SELECT value FROM control_meta),?)",
                         (part, row, cols.get("kind", "x"), cols.get("at", 0.0),
                          cols.get("doc", "")))
        conn.close()

    made: list[ControlStore] = [store]

    def make(**kwargs: Any) -> ControlStore:
        made.append(SqliteControlStore(path, **kwargs))
        return made[-1]

    yield Kit("sqlite", store, make, raw_put, calls)
    for s in made:
        s.close()
    backend.close()


def _azure_kit(port: int) -> Iterator[Kit]:
    from azure.data.tables import TableClient, UpdateMode

    from supervisor.fleet.control.azure_table import AzureTableControlStore

    table = "t" + uuid.uuid4().hex[:20]
    conn = table_connection_string(port)
    calls: list[str] = []

    def hook(request: Any) -> None:
        calls.append(f"{request.http_request.method} {request.http_request.url}")

    made: list[ControlStore] = []

    def make(**kwargs: Any) -> ControlStore:
        kwargs.setdefault("cursor_slack", 0.0)
        made.append(AzureTableControlStore(connection_string=conn, table=table, **kwargs))
        return made[-1]

    raw = TableClient.from_connection_string(conn, table_name=table)
    raw.create_table()  # the store makes it at its first call that misses it: not counted
    store = make(request_hook=hook)

    def raw_put(part: str, row: str, cols: dict[str, Any]) -> None:
        entity = {"PartitionKey": part, "RowKey": row, **cols}
        if isinstance(entity.get("doc"), str):
            entity.update(n=1, d0=entity.pop("doc"))
        raw.upsert_entity(entity, mode=UpdateMode.REPLACE)

    calls.clear()  # creating the table is not part of any test's count
    yield Kit("azure", store, make, raw_put, calls)
    for s in made:
        s.close()
    raw.delete_table()
    raw.close()


def _postgres_kit(url: str) -> Iterator[Kit]:
    import psycopg

    from supervisor.backends.postgres.schema import Tables, migrate
    from supervisor.fleet.control.postgres import PostgresControlStore

    tables = Tables.of("jobq")
    with psycopg.connect(url, autocommit=True) as conn:
        migrate(conn, "jobq")  # the queue's own tables come first, as a worker makes them
    calls: list[str] = []
    made: list[ControlStore] = []

    def make(**kwargs: Any) -> ControlStore:
        made.append(PostgresControlStore(url, "jobq", **kwargs))
        return made[-1]

    def raw_put(part: str, row: str, cols: dict[str, Any]) -> None:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(f"INSERT INTO {tables.control_records} (part, row, kind, at, rev, doc) "
                         f"VALUES (%s, %s, %s, %s, nextval('{tables.control_rev}'), %s) "
                         "ON CONFLICT (part, row) DO UPDATE SET kind = EXCLUDED.kind, "
                         "at = EXCLUDED.at, rev = EXCLUDED.rev, doc = EXCLUDED.doc",
                         (part, row, cols.get("kind", "x"), cols.get("at", 0.0),
                          cols.get("doc", "")))

    store = make(trace=calls.append)
    yield Kit("postgres", store, make, raw_put, calls)
    for s in made:
        s.close()


@pytest.fixture(params=["sqlite", pytest.param("azure", marks=pytest.mark.azure),
                        pytest.param("postgres", marks=pytest.mark.postgres)])
def kit(request, tmp_path) -> Iterator[Kit]:
    if request.param == "sqlite":
        yield from _sqlite_kit(tmp_path)
    elif request.param == "postgres":
        yield from _postgres_kit(request.getfixturevalue("pg_url"))
    else:
        yield from _azure_kit(request.getfixturevalue("azurite_table"))


def doc_text(**fields: Any) -> str:
    return json.dumps(fields)


def azure_ctl(conn: str | None, queue: str, *args: str,
              timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """jobq-ctl on a Service Bus queue nobody can reach, its control store the Table service
    of ``conn`` (None: no control connection string); no JOBQ_* variable of ours leaks in."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("JOBQ_")}
    if conn is not None:
        env["JOBQ_CONTROL_CONNECTION_STRING"] = conn
    return ctl_server.run([*command("jobq-ctl"), "--backend", "servicebus", "--namespace",
                           "nowhere.servicebus.windows.net", "--queue", queue, *args],
                          env=env, timeout=timeout)
