"""control/unique.py: jobq-ctl push's unique-key claims (Storage Queue), on the SQLite
control store (the Azure one passes the same contract, test_contract.py)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import pytest

from supervisor.core.task import Task
from supervisor.fleet.control.base import DAY, ControlStoreError, UniqueClaim
from supervisor.fleet.control.records import ResultRecord
from supervisor.fleet.control.sqlite import SqliteControlStore
from supervisor.fleet.control.unique import CLAIM_MAX_AGE, claim, push_unique, release_final

Q = "jobs"
NOW = 1_700_000_000.0


@pytest.fixture
def store(tmp_path) -> Iterator[SqliteControlStore]:
    s = SqliteControlStore(str(tmp_path / "q.db"))
    yield s
    s.close()


def result(task_id: str, final: bool, key: str | None = "k") -> ResultRecord:
    return ResultRecord(queue=Q, task_id=task_id, attempt=1,
                        outcome="succeeded" if final else "running", reason="", tail="",
                        exit_status=0 if final else None, worker="w", when=NOW, final=final,
                        unique_key=key)


def test_a_live_holder_keeps_the_key(store: SqliteControlStore) -> None:
    assert claim(store, Q, "k", "t1", NOW) == "t1"
    store.put_result(result("t1", final=False))  # running
    assert claim(store, Q, "k", "t2", NOW + 60) == "t1"
    assert claim(store, Q, "k", "t3", NOW + CLAIM_MAX_AGE - 1) == "t1"


def test_an_ended_holder_or_an_old_claim_is_taken_over(store: SqliteControlStore) -> None:
    assert claim(store, Q, "k", "t1", NOW) == "t1"
    store.put_result(result("t1", final=True))  # ended for good, claim never released
    assert claim(store, Q, "k", "t2", NOW + 60) == "t2"
    assert claim(store, Q, "k", "t3", NOW + 61) == "t2"
    assert claim(store, Q, "k", "t4", NOW + 61 + CLAIM_MAX_AGE + 1) == "t4"


def test_the_final_record_releases_the_claim(store: SqliteControlStore) -> None:
    assert claim(store, Q, "k", "t1", NOW) == "t1"
    release_final(store, [result("t1", final=False), result("t0", final=True)])
    held = store.get_claim(Q, "k")
    assert held is not None and held.task_id == "t1"  # not final / not its task
    release_final(store, [result("t1", final=True)])
    assert store.get_claim(Q, "k") is None
    assert claim(store, Q, "k", "t2", NOW + 1) == "t2"


def test_push_unique_skips_held_keys_and_releases_on_failure(
        store: SqliteControlStore) -> None:
    pushed: list[list[str]] = []

    def push(tasks: Sequence[Task]) -> list[str]:
        pushed.append([t.id for t in tasks])
        return [t.id for t in tasks]

    a, b, c = (Task(cmd="true", unique_key=k) for k in ("a", "b", "a"))
    free = Task(cmd="true")
    ids = push_unique(store, push, Q, [a, b, c, free], NOW)
    assert ids == [a.id, b.id, a.id, free.id] and pushed == [[a.id, b.id, free.id]]

    def broken(tasks: Sequence[Task]) -> list[str]:
        raise OSError("queue down")

    d = Task(cmd="true", unique_key="d")
    with pytest.raises(OSError):
        push_unique(store, broken, Q, [d], NOW)
    assert store.get_claim(Q, "d") is None  # a later push is not blocked


def test_a_lost_race_returns_the_winner(store: SqliteControlStore, monkeypatch) -> None:
    assert store.create_claim(UniqueClaim(Q, "k", "t1", NOW - 8 * DAY))
    real = store.replace_claim

    def late(new: UniqueClaim, etag: str) -> bool:
        real(UniqueClaim(Q, "k", "winner", NOW), etag)  # another push got there first
        return real(new, etag)

    monkeypatch.setattr(store, "replace_claim", late)
    assert claim(store, Q, "k", "t2", NOW) == "winner"


def test_a_store_that_fails_stops_the_push(store: SqliteControlStore, monkeypatch) -> None:
    def down(_claim: UniqueClaim) -> bool:
        raise ControlStoreError("control store claim unique key: down")

    monkeypatch.setattr(store, "create_claim", down)
    with pytest.raises(ControlStoreError):
        push_unique(store, lambda ts: [t.id for t in ts], Q,
                    [Task(cmd="true", unique_key="k")], NOW)


def test_a_claim_that_fails_midway_releases_the_earlier_ones(
        store: SqliteControlStore, monkeypatch) -> None:
    real = store.create_claim

    def second_fails(new: UniqueClaim) -> bool:
        if new.key == "b":
            raise ControlStoreError("control store claim unique key: timed out")
        return real(new)

    monkeypatch.setattr(store, "create_claim", second_fails)
    pushed: list[Task] = []
    with pytest.raises(ControlStoreError):
        push_unique(store, lambda ts: pushed.extend(ts) or [t.id for t in ts], Q,
                    [Task(cmd="a", unique_key="a"), Task(cmd="b", unique_key="b")], NOW)
    assert pushed == [] and store.get_claim(Q, "a") is None
