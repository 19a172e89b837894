"""Azurite's blob service for the output-store tests (started once per session on a free
loopback port), and a fresh container per test; the PostgreSQL store's kit: a fresh database
of the session's server (``pg_url``) with the schema migrated.

The Azurite binary is $AZURITE_BLOB_BIN, else ``azurite-blob`` beside $AZURITE_QUEUE_BIN,
else <repo>/.azurite/node_modules/.bin/azurite-blob.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from supervisor.fleet.output.base import AttemptKey, OutputStore
from tests.azurite import (  # noqa: F401 (re-exported)
    ACCOUNT,
    ACCOUNT_KEY,
    blob_connection_string,
    session_service,
)


@pytest.fixture
def blob_store(azurite_blob) -> Iterator[Any]:
    """A factory of BlobOutputStore instances on one fresh container (deleted after)."""
    from azure.storage.blob import ContainerClient

    from supervisor.fleet.output.azure_blob import BlobOutputStore

    conn = blob_connection_string(azurite_blob)
    container = "t" + uuid.uuid4().hex[:20]
    made: list[BlobOutputStore] = []

    def make(**kwargs: Any) -> BlobOutputStore:
        kwargs.setdefault("connection_string", conn)
        made.append(BlobOutputStore(container=container, **kwargs))
        return made[-1]

    make.container = container  # type: ignore[attr-defined]
    make.raw = ContainerClient.from_connection_string(  # type: ignore[attr-defined]
        conn, container_name=container)
    yield make
    for s in made:
        s.close()
    try:
        make.raw.delete_container()  # type: ignore[attr-defined]
    except Exception:  # noqa: BLE001 - never created (a create=False test)
        pass
    make.raw.close()  # type: ignore[attr-defined]


@pytest.fixture
def pg_output_store(pg_url) -> Iterator[Any]:
    """A factory of PostgresOutputStore instances on one fresh, migrated database
    (``make.url``: its URI; ``make.sql(...)``: a statement as the superuser, its rows)."""
    import psycopg

    from supervisor.backends.postgres.schema import migrate
    from supervisor.fleet.output.postgres import PostgresOutputStore

    with psycopg.connect(pg_url, autocommit=True) as conn:
        migrate(conn, "jobq")
    made: list[PostgresOutputStore] = []

    def make(**kwargs: Any) -> PostgresOutputStore:
        kwargs.setdefault("url", pg_url)
        kwargs.setdefault("schema", "jobq")
        made.append(PostgresOutputStore(**kwargs))
        return made[-1]

    def sql(statement: str, args: tuple = ()) -> list[tuple]:
        with psycopg.connect(pg_url, autocommit=True) as conn:
            cur = conn.execute(statement, args)
            return cur.fetchall() if cur.description else []

    make.url = pg_url  # type: ignore[attr-defined]
    make.sql = sql  # type: ignore[attr-defined]
    yield make
    for s in made:
        s.close()


def wait_until(wall: float) -> None:
    """Until time.time() >= wall (a few seconds at most)."""
    deadline = time.monotonic() + 5.0
    while time.time() < wall:
        assert time.monotonic() < deadline, "the wall clock does not advance"
        time.sleep(0.02)


def read_all(store: OutputStore, key: AttemptKey, limit: int = 1 << 20) -> tuple[bytes, bool]:
    out, offset = b"", 0
    while True:
        chunk = store.read(key, offset, limit)
        out += chunk.data
        offset = chunk.offset
        if not chunk.data:
            return out, chunk.complete
