"""A store that is down, hung or locked raises ControlStoreError quickly; the SQLite store
shares the queue's file with a working SqliteBackend."""

from __future__ import annotations

import socket
import sqlite3
import threading
import time
import uuid
from collections.abc import Iterator

import pytest

from supervisor.backends.sqlite.backend import SqliteBackend
from supervisor.core.task import Task
from supervisor.fleet.control import Cancel, ControlStoreError
from supervisor.fleet.control.base import UniqueClaim
from supervisor.fleet.control.sqlite import SqliteControlStore

from .conftest import QUEUE, free_port, table_connection_string

NOW = 1_700_000_000.0


def _cancel(task_id: str = "t1") -> Cancel:
    return Cancel(queue=QUEUE, task_id=task_id, reason="r", who="w", when=NOW)


@pytest.fixture
def black_hole() -> Iterator[int]:
    """A loopback port that accepts connections and never answers."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.1)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield server.getsockname()[1]
    stop.set()
    thread.join(timeout=5)
    for conn in held:
        conn.close()
    server.close()


@pytest.mark.timing  # asserts a wall-clock bound
@pytest.mark.azure
def test_azure_store_down_raises_quickly() -> None:
    from supervisor.fleet.control.azure_table import AzureTableControlStore

    conn = table_connection_string(free_port())  # nothing listens there
    start = time.monotonic()
    AzureTableControlStore(connection_string=conn).close()  # makes its table later: no call
    store = AzureTableControlStore(connection_string=conn, create=False)
    with pytest.raises(ControlStoreError, match="poll"):
        store.poll(QUEUE, "w1")
    with pytest.raises(ControlStoreError, match="write cancel"):
        store.put_cancel(_cancel())
    store.close()
    assert time.monotonic() - start < 5, "the SDK retried instead of failing"


@pytest.mark.azure
def test_azure_store_makes_its_table_at_the_first_call_that_misses_it(azurite_table) -> None:
    """Not at start: a worker's first poll is one round trip before its first receive."""
    from azure.data.tables import TableServiceClient

    from supervisor.fleet.control.azure_table import AzureTableControlStore

    conn = table_connection_string(azurite_table)
    table = "t" + uuid.uuid4().hex[:20]
    calls: list[str] = []
    store = AzureTableControlStore(connection_string=conn, table=table,
                                   request_hook=lambda r: calls.append(r.http_request.method))
    assert calls == []
    assert not store.poll(QUEUE, "w1").cancels  # 404, create, the poll again
    assert calls == ["GET", "POST", "GET"]
    store.put_cancel(_cancel())
    assert [c.task_id for c in store.poll(QUEUE, "w1").cancels] == ["t1"]
    assert calls[3:] == ["PUT", "GET"]  # made once
    store.close()
    reader = AzureTableControlStore(connection_string=conn, table=table + "x", create=False)
    assert not reader.poll(QUEUE, "w1").cancels  # a reader never makes it
    reader.close()
    service = TableServiceClient.from_connection_string(conn)
    assert [t.name for t in service.list_tables()
            if t.name.startswith(table)] == [table]
    # An insert's error names the missing table only in its text: made all the same.
    claims = AzureTableControlStore(connection_string=conn, table=table + "c")
    assert claims.create_claim(UniqueClaim(queue=QUEUE, key="k", task_id="t1", when=NOW))
    assert not claims.create_claim(UniqueClaim(queue=QUEUE, key="k", task_id="t2", when=NOW))
    claims.close()


@pytest.mark.timing  # times the read timeout
@pytest.mark.azure
def test_azure_store_hung_raises_after_read_timeout(black_hole: int) -> None:
    from supervisor.fleet.control.azure_table import AzureTableControlStore

    store = AzureTableControlStore(connection_string=table_connection_string(black_hole),
                                   create=False, read_timeout=1.0)
    start = time.monotonic()
    with pytest.raises(ControlStoreError, match="poll"):
        store.poll(QUEUE, "w1")
    took = time.monotonic() - start
    store.close()
    assert 0.9 < took < 5, took


@pytest.mark.azure
def test_azure_secrets_are_not_in_errors() -> None:
    from supervisor.fleet.control.azure_table import AzureTableControlStore

    conn = table_connection_string(free_port())
    with pytest.raises(ControlStoreError) as info:
        AzureTableControlStore(connection_string=conn).poll(QUEUE, "w1")
    assert "Eby8vdM02x" not in str(info.value)


@pytest.mark.timing  # asserts a 3 s bound
def test_sqlite_locked_database_raises_within_busy_timeout(tmp_path) -> None:
    path = str(tmp_path / "queue.db")
    store = SqliteControlStore(path, busy_timeout=0.3)
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")  # another process holding the write lock
    try:
        start = time.monotonic()
        with pytest.raises(ControlStoreError, match="write cancel"):
            store.put_cancel(_cancel())
        assert time.monotonic() - start < 3
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    store.put_cancel(_cancel())  # and works again once the lock is gone
    assert store.get_cancel(QUEUE, "t1") is not None
    store.close()


def test_sqlite_store_opening_a_rollback_mode_file_waits_for_its_writer(tmp_path) -> None:
    # SQLite refuses the switch to WAL at once (no busy handler) while another connection
    # holds the write lock of a file still in rollback mode; the store waits its turn.
    path = str(tmp_path / "queue.db")
    writer = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    writer.execute("CREATE TABLE other (x)")
    writer.execute("BEGIN IMMEDIATE")
    release = threading.Timer(0.3, writer.execute, ("ROLLBACK",))
    release.start()
    try:
        store = SqliteControlStore(path, busy_timeout=20.0)
    finally:
        release.join()
        writer.close()
    store.put_cancel(_cancel())
    assert store.get_cancel(QUEUE, "t1") is not None
    store.close()


def test_sqlite_missing_directory_is_a_config_error(tmp_path) -> None:
    from supervisor.fleet.control import ControlConfigError

    with pytest.raises(ControlConfigError, match="does not exist"):
        SqliteControlStore(str(tmp_path / "nope" / "queue.db"))


def test_sqlite_store_coexists_with_the_queue(tmp_path) -> None:
    path = str(tmp_path / "queue.db")
    backend = SqliteBackend(path, QUEUE, "w1")
    store = SqliteControlStore(path)
    try:
        backend.push([Task(cmd="true", id="a"), Task(cmd="true", id="b")])
        store.put_cancel(_cancel("a"))
        (lease,) = backend.receive(1, 60)
        assert lease.task is not None and lease.task.id == "a"
        assert store.get_cancel(QUEUE, lease.task.id) is not None  # found at claim time
        lease.complete()
        assert backend.size() == 1
        SqliteControlStore(path).close()  # opening again keeps what is there
        assert store.get_cancel(QUEUE, "a") is not None
        tables = {r[0] for r in sqlite3.connect(path).execute(
            "SELECT name FROM sqlite_master WHERE type='table'")}
        assert {"jobs", "control_records", "control_meta"} <= tables
    finally:
        store.close()
        backend.close()
