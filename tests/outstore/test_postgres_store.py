"""The PostgreSQL output store beyond the contract (a real server): fencing of a stale
writer, a lost answer stored once, chunks and reads across them, purge in bounded steps,
NOTIFY after a commit, readers that create nothing, one-line errors without the password."""

from __future__ import annotations

import math
import time

import psycopg
import pytest

from supervisor.fleet.output import postgres as pgstore
from supervisor.fleet.output.base import AttemptKey, OutputConfigError, OutputStoreError
from tests.outstore.conftest import read_all, wait_until
from tests.postgres.server import PASSWORD

pytestmark = [pytest.mark.postgres, pytest.mark.timeout(60)]
KEY = AttemptKey("jobs", "t-1", 1)


def test_a_stale_writer_stores_nothing_after_a_rerun_took_over(pg_output_store) -> None:
    first, second = pg_output_store(), pg_output_store()
    assert first.reopen(KEY) == 0
    first.append(KEY, b"first\n")
    assert second.reopen(KEY) == 6  # the rerun, on another worker
    second.append(KEY, b"second\n")
    first.append(KEY, b"late\n")  # the stopped worker's buffers: dropped, no error
    first.finish(KEY)  # ... nor does it mark the rerun's output complete
    assert read_all(second, KEY) == (b"first\nsecond\n", False)
    second.finish(KEY)
    assert read_all(first, KEY) == (b"first\nsecond\n", True)


def test_a_lost_answer_is_not_stored_twice(pg_output_store, monkeypatch) -> None:
    store = pg_output_store()
    store.append(KEY, b"zero\n")
    real = pgstore.execute
    lost: list[str] = []

    def lose_answer(conn, sql, args=None, *, timeout):  # committed, then the link broke
        cur = real(conn, sql, args, timeout=timeout)
        if "INSERT INTO" in sql and "output_chunks" in sql and not lost:
            lost.append(sql)
            raise psycopg.OperationalError("connection reset (test)")
        return cur

    monkeypatch.setattr(pgstore, "execute", lose_answer)
    with pytest.raises(OutputStoreError, match="connection reset"):
        store.append(KEY, b"one\n")
    store.append(KEY, b"one\n")  # the caller's retry: same bytes
    store.append(KEY, b"two\n")
    assert read_all(store, KEY)[0] == b"zero\none\ntwo\n" and lost
    # Bytes given up on (the caller appends a marker instead) stay where they landed.
    lost.clear()
    with pytest.raises(OutputStoreError):
        store.append(KEY, b"dddd")
    store.append(KEY, b"[dropped]")  # as long as the lost bytes and more: no mix-up
    assert read_all(store, KEY)[0] == b"zero\none\ntwo\ndddd[dropped]"


def test_big_appends_are_chunked_and_read_across_chunks(pg_output_store) -> None:
    store = pg_output_store(chunk_max=5)
    # 1,024 bytes: 2 + 204 chunks.  (10 KiB took ~15,600 reads at the small limits below:
    # 29 s in a busy parallel phase, past the 60 s timeout in another.)
    data = bytes(range(256)) * 4
    store.append(KEY, data[:7])
    store.append(KEY, data[7:])
    assert pg_output_store.sql("SELECT count(*) FROM jobq.output_chunks") == [(206,)]
    for limit in (1, 4, 5, 13, 4096, 1 << 20):
        assert read_all(store, KEY, limit)[0] == data
    assert store.read(KEY, 3, 9).data == data[3:12] and store.read(KEY, 3, 9).offset == 12
    assert store.read(KEY, len(data)).data == b""
    again = pg_output_store()  # another instance (a new process) continues at the end
    again.append(KEY, b"tail")
    assert read_all(again, KEY)[0] == data + b"tail"


def test_purge_goes_in_bounded_steps(pg_output_store) -> None:
    store = pg_output_store(chunk_max=2, purge_max=2, purge_batch=2)
    for t in range(4):
        store.append(AttemptKey("jobs", f"old-{t}", 1), b"aabbccdd")  # 4 chunks each
    before = math.ceil(time.time() + 0.001)
    wait_until(before + 0.05)
    store.append(AttemptKey("jobs", "new", 1), b"aabbcc")
    counts = [store.purge(before) for _ in range(4)]
    assert counts == [2, 2, 0, 0]
    assert pg_output_store.sql("SELECT DISTINCT task_id FROM jobq.output_chunks") == [("new",)]
    assert pg_output_store.sql("SELECT task_id FROM jobq.outputs") == [("new",)]


def test_an_append_notifies_after_its_commit(pg_output_store) -> None:
    with psycopg.connect(pg_output_store.url, autocommit=True) as listener:
        listener.execute('LISTEN "jobq.output"')
        store = pg_output_store()
        store.append(AttemptKey("q", "a/b", 3), b"x")
        store.finish(AttemptKey("q", "a/b", 3))
        got = [n.payload for n in listener.notifies(timeout=2, stop_after=2)]
        assert got == ["q/a/b/3", "q/a/b/3"]
        pg_output_store(notify=False).append(KEY, b"y")
        assert [n.payload for n in listener.notifies(timeout=0.5)] == []


def test_readers_create_nothing_and_an_old_schema_reads_empty(pg_output_store) -> None:
    pg_output_store.sql("DROP TABLE jobq.output_chunks, jobq.outputs")
    pg_output_store.sql("UPDATE jobq.meta SET value = '1'")
    reader = pg_output_store(create=False)
    assert reader.read(KEY).data == b"" and not reader.read(KEY).complete
    assert reader.attempts("jobs", "t-1") == [] and reader.purge(time.time()) == 0
    with pytest.raises(OutputStoreError):
        reader.append(KEY, b"x")
    assert pg_output_store.sql("SELECT relname FROM pg_class WHERE relname LIKE 'output%%'") \
        == []


def test_errors_are_one_line_without_the_password(pg_server, pg_output_store) -> None:
    db = pg_output_store.url.rsplit("/", 1)[1]
    wrong = pg_server.url(db, password="Wr0ngPassw0rd")
    store = pg_output_store(url=wrong)
    with pytest.raises(OutputStoreError) as err:
        store.read(KEY)
    text = str(err.value)
    assert "\n" not in text and "Wr0ngPassw0rd" not in text and PASSWORD not in text
    with pytest.raises(OutputConfigError):
        pg_output_store(schema="No-Such")
    assert "Wr0ngPassw0rd" not in repr(store)
