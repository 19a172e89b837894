"""The output-store contract, run against every store: files (SQLite queues), append blobs
on Azurite's blob service (Azure) and tables on a real PostgreSQL server."""

from __future__ import annotations

import math
import time
from collections.abc import Iterator

import pytest

from supervisor.fleet.output.base import AttemptKey, Chunk, OutputStore
from supervisor.fleet.output.files import FileOutputStore, part
from tests.outstore.conftest import read_all, wait_until

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(params=["files", pytest.param("blob", marks=pytest.mark.azure),
                        pytest.param("postgres", marks=pytest.mark.postgres)])
def store(request, tmp_path) -> Iterator[OutputStore]:
    if request.param in ("blob", "postgres"):
        kit = "blob_store" if request.param == "blob" else "pg_output_store"
        yield request.getfixturevalue(kit)()  # closed by its fixture
        return
    s = FileOutputStore(str(tmp_path / "jobq.db.output"))
    yield s
    s.close()


def test_append_read_finish(store):
    key = AttemptKey("default", "t-1", 1)
    assert store.read(key).data == b"" and not store.read(key).complete
    assert store.attempts("default", "t-1") == []
    store.append(key, b"one\n")
    store.append(key, b"two\n")
    chunk = store.read(key)
    assert (chunk.data, chunk.offset, chunk.complete) == (b"one\ntwo\n", 8, False)
    assert store.read(key, 4).data == b"two\n"
    assert store.read(key, 1, limit=3).data == b"ne\n"
    store.finish(key)
    assert read_all(store, key, limit=3) == (b"one\ntwo\n", True)
    assert store.read(key, 8).complete


def test_attempts_are_apart_and_listed(store):
    for attempt in (2, 1, 10):
        store.append(AttemptKey("default", "t", attempt), f"a{attempt}".encode())
    store.finish(AttemptKey("default", "t", 3))  # ended without output
    assert store.attempts("default", "t") == [1, 2, 3, 10]
    assert store.read(AttemptKey("default", "t", 10)).data == b"a10"
    assert read_all(store, AttemptKey("default", "t", 3)) == (b"", True)
    assert store.attempts("other", "t") == []


def test_ids_cannot_escape_their_directory(store, tmp_path, request):
    evils = ("../../x", "/etc/passwd", ".", "..", "a/b", "%2F", "a.", "é")
    for evil in evils:
        store.append(AttemptKey("default", evil, 1), evil.encode())
        assert store.read(AttemptKey("default", evil, 1)).data == evil.encode()
    for evil in evils:
        assert store.attempts("default", evil) == [1]
    assert store.attempts("default", "a") == []
    assert len({part(e) for e in ("a/b", "a%2Fb", "a_b")}) == 3
    if store.name == "files":
        assert {p.name for p in tmp_path.iterdir()} == {"jobq.db.output"}
    elif store.name == "postgres":  # the ids as given, in rows: no path to escape
        rows = request.getfixturevalue("pg_output_store").sql(
            "SELECT queue, task_id, attempt FROM jobq.outputs ORDER BY task_id")
        assert rows == sorted(("default", e, 1) for e in evils)
    else:
        names = [b.name for b in request.getfixturevalue("blob_store").raw.list_blobs()]
        assert len(names) == len(evils)
        assert all(n.startswith("default/") and n.count("/") == 2 and n.endswith("/1.log")
                   and "/." not in n and "./" not in n for n in names), names


def test_purge_deletes_old_attempts_only(store):
    old, new = AttemptKey("default", "old", 1), AttemptKey("default", "new", 1)
    store.append(old, b"x")
    store.finish(old)
    # A whole second: a blob's last-modified time has whole seconds.
    before = math.ceil(time.time() + 0.001)
    wait_until(before + 0.05)
    store.append(new, b"y")
    assert store.purge(before) == 1
    assert store.attempts("default", "old") == [] and store.read(old).data == b""
    assert store.read(new).data == b"y"
    assert store.purge(before) == 0


def test_reopen_after_finish_makes_the_output_live_again(store):
    """A run after an uncounted release has the same key: reopen says what is there and
    takes back ``complete`` until the new run's finish."""
    key = AttemptKey("default", "rerun", 2)
    assert store.reopen(key) == 0  # new: nothing there (the usual case)
    store.append(key, b"first run\n")
    store.finish(key)
    assert read_all(store, key) == (b"first run\n", True)
    assert store.reopen(key) == 10
    assert store.reopen(key) == 10  # idempotent: a retried reopen
    assert store.read(key, 10) == Chunk(b"", 10, False)
    assert read_all(store, key) == (b"first run\n", False)
    store.append(key, b"second\n")
    assert read_all(store, key) == (b"first run\nsecond\n", False)
    store.finish(key)
    assert read_all(store, key) == (b"first run\nsecond\n", True)
    assert store.attempts("default", "rerun") == [2]


def test_reopen_of_output_never_finished_or_finished_empty(store):
    live, empty = AttemptKey("default", "r", 1), AttemptKey("default", "r", 2)
    store.append(live, b"abc")  # its worker died before finish
    assert store.reopen(live) == 3
    store.append(live, b"d")
    assert read_all(store, live) == (b"abcd", False)
    store.finish(empty)  # ended without output
    assert store.reopen(empty) == 0
    assert not store.read(empty).complete
    store.append(empty, b"x")
    store.finish(empty)
    assert read_all(store, empty) == (b"x", True)
