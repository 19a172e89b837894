"""The ControlStore contract, run against SQLite, Azure Table (Azurite) and PostgreSQL alike."""

from __future__ import annotations

import logging
import time
from typing import Any

import pytest

from supervisor.core.signing import SigningKey, key_id
from supervisor.fleet.control import (
    Cancel,
    Command,
    PurgeCounts,
    QueueFlag,
    ResultRecord,
    TaskInfo,
    WorkerRecord,
    new_seq,
    worker_state,
)
from supervisor.fleet.control.base import DAY, WORKER_PURGE_AGE, queue_partition, worker_partition
from supervisor.fleet.control.records import CMD_CHARS, AuditRecord, HistoryPoint
from supervisor.fleet.control.signing import Gate, sign, verify

from .conftest import QUEUE, Kit, doc_text

NOW = 1_700_000_000.0  # the injected wall clock
KEY = SigningKey(kid=key_id(b"k" * 32), secret=b"k" * 32)


def worker(wid: str = "host-1:100", queue: str = QUEUE, heartbeat: float = NOW,
           tasks: int = 0, cmd: str = "sleep 10", state: str = "running") -> WorkerRecord:
    infos = tuple(TaskInfo(id=f"task-{i:05d}", attempt=1, pid=20_000 + i, started=NOW - i,
                           lease_expires=NOW + 300.5, cmd=cmd) for i in range(tasks))
    return WorkerRecord(id=wid, queue=queue, host="host-1", pid=100, version="0.1.0",
                        state=state, slots_used=tasks, slots_total=max(tasks, 4),
                        started=NOW - 60, heartbeat=heartbeat, tasks=infos)


def cancel(task_id: str = "t1", when: float = NOW, queue: str = QUEUE) -> Cancel:
    return Cancel(queue=queue, task_id=task_id, reason="wrong input", who="alice@ctl",
                  when=when, grace=5.0)


# --------------------------------------------------------------------------------- workers
def test_workers_upsert_list_delete(kit: Kit) -> None:
    s = kit.store
    s.put_worker(worker("a"))
    s.put_worker(worker("b", state="draining"))
    s.put_worker(worker("c", queue="other"))
    assert [w.id for w in s.workers(QUEUE)] == ["a", "b"]
    assert sorted(w.id for w in s.workers()) == ["a", "b", "c"]
    s.put_worker(worker("a", heartbeat=NOW + 15, tasks=2))
    a = next(w for w in s.workers(QUEUE) if w.id == "a")
    assert a == worker("a", heartbeat=NOW + 15, tasks=2)
    s.delete_worker(QUEUE, "a")
    s.delete_worker(QUEUE, "a")  # a clean exit twice: no error
    assert [w.id for w in s.workers(QUEUE)] == ["b"]


def test_thousand_tasks_round_trip(kit: Kit) -> None:
    record = worker(tasks=1000, cmd="python train.py --seed 1 " + "x" * 300)
    kit.store.put_worker(record)
    (back,) = kit.store.workers(QUEUE)
    assert len(back.tasks) == 1000 and back.tasks_omitted == 0
    assert all(len(t.cmd) == CMD_CHARS for t in back.tasks)
    assert back.tasks[999] == TaskInfo(id="task-00999", attempt=1, pid=20_999,
                                       started=NOW - 999, lease_expires=NOW + 300.5,
                                       cmd=record.tasks[999].cmd[:CMD_CHARS])


def test_too_many_tasks_are_counted_not_lost(kit: Kit) -> None:
    # Non-ASCII commands take twice the UTF-16 room: the record must still fit one entity.
    kit.store.put_worker(worker(tasks=4000, cmd="é" * 400))
    (back,) = kit.store.workers(QUEUE)
    assert back.slots_used == 4000
    assert 1000 <= len(back.tasks) < 4000
    assert len(back.tasks) + back.tasks_omitted == 4000


def test_lost_and_purged_by_age(kit: Kit) -> None:
    s = kit.store
    s.put_worker(worker("fresh", heartbeat=NOW))
    s.put_worker(worker("stale", heartbeat=NOW - 50))
    s.put_worker(worker("ancient", heartbeat=NOW - WORKER_PURGE_AGE - 1))
    states = {w.id: worker_state(w, NOW) for w in s.workers(QUEUE)}
    assert states == {"fresh": "running", "stale": "lost", "ancient": "lost"}
    assert worker_state(worker(heartbeat=NOW - 45), NOW) == "running"  # 3 intervals: not yet
    counts = s.purge(NOW)
    assert counts.workers == 1
    assert sorted(w.id for w in s.workers(QUEUE)) == ["fresh", "stale"]


# --------------------------------------------------------------------------------- cancels
def test_cancel_point_lookup_and_ttl(kit: Kit) -> None:
    s = kit.store
    s.put_cancel(cancel("t1"))
    s.put_cancel(cancel("old", when=NOW - 8 * DAY))
    s.put_cancel(cancel("t1", queue="other"))
    assert s.get_cancel(QUEUE, "t1") == cancel("t1")
    assert s.get_cancel(QUEUE, "missing") is None
    assert s.get_cancel(QUEUE, "t") is None  # a prefix is not a match
    assert [c.task_id for c in s.cancels(QUEUE)] == ["old", "t1"]
    assert s.purge(NOW).cancels == 1
    assert [c.task_id for c in s.cancels(QUEUE)] == ["t1"]
    assert s.get_cancel("other", "t1") is not None


def test_delete_cancel_forgets_one_task_in_one_queue(kit: Kit) -> None:
    s = kit.store
    s.put_cancel(cancel("t1"))
    s.put_cancel(cancel("t2"))
    s.put_cancel(cancel("t1", queue="other"))
    s.delete_cancel(QUEUE, "t1")
    s.delete_cancel(QUEUE, "never-cancelled")  # absent: no error
    assert s.get_cancel(QUEUE, "t1") is None
    assert [c.task_id for c in s.cancels(QUEUE)] == ["t2"]
    assert s.get_cancel("other", "t1") is not None


def test_cancel_lookup_costs_one_call(kit: Kit) -> None:
    kit.store.put_cancel(cancel("t1"))
    kit.calls.clear()
    assert kit.store.get_cancel(QUEUE, "t1") is not None
    assert _calls(kit) == 1


def test_signed_and_unsigned_cancels(kit: Kit, caplog: pytest.LogCaptureFixture) -> None:
    s = kit.store
    s.put_cancel(sign(cancel("signed"), KEY))
    s.put_cancel(cancel("unsigned"))
    forged = sign(cancel("forged"), KEY)
    s.put_cancel(Cancel(**{**forged.__dict__, "reason": "changed after signing"}))
    snap = s.poll(QUEUE, "w1")
    by_id = {c.task_id: c for c in snap.cancels}
    assert verify(by_id["signed"], [KEY]) is None
    assert verify(by_id["unsigned"], [KEY]) == "unsigned"
    assert verify(by_id["forged"], [KEY]) == "tampered (MAC mismatch)"
    gate = Gate([KEY])
    with caplog.at_level(logging.WARNING, logger="jobq.control"):
        for _ in range(3):  # every poll sees them again; each is logged once
            assert [c.task_id for c in gate.filter(s.poll(QUEUE, "w1").cancels)] == ["signed"]
    assert len([r for r in caplog.records if "ignored cancel" in r.message]) == 2
    assert len(Gate([]).filter(snap.cancels)) == 3  # no keys configured: all are data


# ----------------------------------------------------------------------- flags and commands
def test_pause_and_resume(kit: Kit) -> None:
    s = kit.store
    assert s.poll(QUEUE, "w1").flag is None
    s.put_flag(QueueFlag(queue=QUEUE, paused=True, who="bob", when=NOW))
    assert s.poll(QUEUE, "w1").flag == QueueFlag(queue=QUEUE, paused=True, who="bob", when=NOW)
    assert s.poll("other", "w1").flag is None
    s.put_flag(QueueFlag(queue=QUEUE, paused=False, who="carol", when=NOW + 1))
    flag = s.poll(QUEUE, "w1").flag
    assert flag is not None and not flag.paused and flag.who == "carol"


def test_commands_are_for_one_worker_and_consumed_once(kit: Kit) -> None:
    s = kit.store
    # "h" must not see the commands of "h:1" (its id starts with "h:")
    for wid, action, t in (("h", "drain", 0), ("h:1", "stop", 1), ("h", "stop", 2)):
        s.put_command(Command(queue=QUEUE, worker=wid, seq=new_seq(NOW + t), action=action,
                              who="ops", when=NOW + t))
    mine = s.poll(QUEUE, "h").commands
    assert [c.action for c in mine] == ["drain", "stop"]  # in the order given
    s.ack_command(mine[0])
    s.ack_command(mine[0])  # acknowledged twice: no error, no effect
    assert [c.action for c in s.poll(QUEUE, "h").commands] == ["stop"]
    assert [c.action for c in s.poll(QUEUE, "h:1").commands] == ["stop"]
    assert s.poll(QUEUE, "nobody").commands == ()


# -------------------------------------------------------------------------------- the poll
def test_poll_is_one_call_and_returns_everything(kit: Kit) -> None:
    s = kit.store
    s.put_flag(QueueFlag(queue=QUEUE, paused=True, who="bob", when=NOW))
    for i in range(5):
        s.put_cancel(cancel(f"t{i}"))
    s.put_command(Command(queue=QUEUE, worker="w1", seq=new_seq(NOW), action="drain",
                          who="ops", when=NOW))
    s.put_command(Command(queue=QUEUE, worker="w2", seq=new_seq(NOW), action="stop",
                          who="ops", when=NOW))
    s.put_worker(worker("w1", tasks=1000))  # in its own partition: not in the poll
    kit.calls.clear()
    snap = s.poll(QUEUE, "w1")
    assert _calls(kit) == 1
    assert snap.flag is not None and snap.flag.paused
    assert sorted(c.task_id for c in snap.cancels) == [f"t{i}" for i in range(5)]
    assert [(c.worker, c.action) for c in snap.commands] == [("w1", "drain")]


def test_poll_cursor_returns_new_cancels(kit: Kit) -> None:
    s = kit.store
    s.put_cancel(cancel("first"))
    first = s.poll(QUEUE, "w1")
    assert [c.task_id for c in first.cancels] == ["first"] and first.cursor is not None
    _later(kit)
    s.put_cancel(cancel("second"))
    second = s.poll(QUEUE, "w1", first.cursor)
    assert "second" in [c.task_id for c in second.cancels]
    third = s.poll(QUEUE, "w1", second.cursor)
    assert "first" not in [c.task_id for c in third.cancels]
    assert s.poll(QUEUE, "w1", "not a cursor").cancels  # a foreign cursor: all live ones
    idle = s.poll("other", "w1")
    assert idle.cancels == () and idle.cursor is None


def test_idle_worker_calls_per_hour(kit: Kit) -> None:
    """Six minutes of an idle worker (5 s polls, 15 s heartbeats) on the injected clock, and
    the hourly purge: 10 x (72 + 24) + 1 = 961 calls per hour."""
    s = kit.store
    s.put_cancel(cancel("seen-long-ago"))
    cursor = s.poll(QUEUE, "w1").cursor
    kit.calls.clear()
    for step in range(72):  # 360 s / 5 s
        now = NOW + 5 * step
        if step % 3 == 0:
            s.put_worker(worker("w1", heartbeat=now))
        cursor = s.poll(QUEUE, "w1", cursor).cursor
    assert s.purge(NOW + 360) == PurgeCounts()
    if kit.kind == "azure":
        assert len(kit.calls) == 97
        assert [c.split()[0] for c in kit.calls].count("PUT") == 24  # the upserts
    else:
        statements = [c.split()[0] for c in kit.calls]
        assert (statements.count("INSERT"), statements.count("SELECT"),
                statements.count("DELETE")) == (24, 72, 1)


# ----------------------------------------------------------------------------- robustness
def test_corrupt_and_foreign_records_are_skipped(kit: Kit,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    s = kit.store
    s.put_cancel(cancel("good"))
    s.put_worker(worker("good"))
    qp, wp = queue_partition(QUEUE), worker_partition(QUEUE)
    kit.raw_put(qp, "cancel:badjson", {"kind": "cancel", "doc": "{not json"})
    kit.raw_put(qp, "cancel:badtype", {"kind": "cancel", "doc": doc_text(
        v=1, kind="cancel", queue=QUEUE, task_id=7, reason="r", who="w", when=NOW)})
    kit.raw_put(qp, "flag", {"kind": "flag", "doc": doc_text(
        v=1, kind="flag", queue=QUEUE, paused="yes", who="w", when=NOW)})
    kit.raw_put(wp, "future", {"kind": "worker", "doc": doc_text(v=2, kind="worker")})
    kit.raw_put(wp, "foreign", {"kind": "worker", "at": NOW})
    with caplog.at_level(logging.WARNING, logger="jobq.control"):
        for _ in range(2):
            snap = s.poll(QUEUE, "w1")
            assert [c.task_id for c in snap.cancels] == ["good"] and snap.flag is None
            assert [w.id for w in s.workers(QUEUE)] == ["good"]
    skipped = [r.message for r in caplog.records if "skipped record" in r.message]
    assert len(skipped) == 5, skipped  # each once, though read twice
    assert any("unknown version 2" in m for m in skipped)


def test_results(kit: Kit) -> None:
    s = kit.store
    for i, outcome in enumerate(("cancelled", "failed", "cancelled")):
        s.put_result(ResultRecord(queue=QUEUE, task_id=f"t{i}", attempt=1, outcome=outcome,
                                  reason="cancelled by alice: wrong input", tail="line\n" * 3,
                                  exit_status=None if outcome == "cancelled" else 1,
                                  worker="w1", when=NOW + i))
    assert [r.task_id for r in s.results(QUEUE, "cancelled")] == ["t0", "t2"]
    assert len(s.results(QUEUE)) == 3
    assert s.purge(NOW + 8 * DAY).results == 3


def test_records_are_shared_between_instances(kit: Kit) -> None:
    other = kit.make()
    kit.store.put_cancel(cancel("t1"))
    assert other.get_cancel(QUEUE, "t1") == cancel("t1")


# --------------------------------------------------------------------------------- helpers
def _calls(kit: Kit) -> int:
    if kit.kind == "azure":
        return len(kit.calls)
    return len([c for c in kit.calls if c.startswith("SELECT")])


def _later(kit: Kit) -> None:
    """Let the service's clock move on (Azure's Timestamp cursor); SQLite needs nothing."""
    if kit.kind == "azure":
        time.sleep(0.05)


def test_results_of_one_task_by_attempt(kit: Kit) -> None:
    s = kit.store
    for task, attempt, outcome in (("t:1", 2, "failed"), ("t:1", 1, "lock-lost"),
                                   ("t:10", 1, "running"), ("t", 1, "succeeded")):
        s.put_result(ResultRecord(queue=QUEUE, task_id=task, attempt=attempt, outcome=outcome,
                                  reason="", tail="", exit_status=None, worker="w1", when=NOW,
                                  started=NOW - 5, signal=9 if outcome == "lock-lost" else None))
    got = s.results_of(QUEUE, "t:1")
    assert [(r.attempt, r.outcome, r.signal, r.started) for r in got] == [
        (1, "lock-lost", 9, NOW - 5), (2, "failed", None, NOW - 5)]
    assert [r.task_id for r in s.results_of(QUEUE, "t")] == ["t"]
    assert s.results_of(QUEUE, "nope") == [] and s.results_of("other", "t") == []


def _result(task: str, attempt: int, outcome: str, when: float = NOW, **kw: Any
            ) -> ResultRecord:
    values: dict[str, Any] = {"reason": "", "tail": "", "exit_status": None, **kw}
    return ResultRecord(queue=QUEUE, task_id=task, attempt=attempt, outcome=outcome,
                        worker="w1", when=when, **values)


def test_put_results_writes_a_batch_last_record_of_a_key_wins(kit: Kit) -> None:
    s = kit.store
    batch = [_result(f"t{i}", 1, "running", started=NOW) for i in range(150)]
    batch += [_result("t0", 1, "succeeded", when=NOW + 1, final=True, exit_status=0),
              _result("t1", 1, "failed", when=NOW + 2, exit_status=3),
              _result("t2", 1, "cancelled", when=NOW + 3, cancelled_by="alice@h", final=True)]
    kit.calls.clear()
    s.put_results(batch)
    if kit.kind in ("sqlite", "postgres"):  # one transaction for the whole batch
        assert [c for c in kit.calls if c.startswith(("BEGIN", "COMMIT"))] == [
            "BEGIN IMMEDIATE" if kit.kind == "sqlite" else "BEGIN", "COMMIT"]
    else:  # 150 rows of "r:" in two batch transactions, the two of "x:" in one
        assert len([c for c in kit.calls if c.startswith("POST")]) == 3
    assert len(s.results(QUEUE)) == 150
    (t0,) = s.results_of(QUEUE, "t0")
    assert (t0.outcome, t0.final, t0.started) == ("succeeded", True, None)
    assert [r.task_id for r in s.results(QUEUE, "failed")] == ["t1"]
    (t2,) = s.results(QUEUE, "cancelled")
    assert t2 == batch[-1]
    s.put_results([])  # nothing to write: no error


def test_text_with_lone_surrogates_is_stored_and_read_back(kit: Kit) -> None:
    # A task's output or reason can reach a record as a lone surrogate (bytes that are not
    # UTF-8); written raw it failed every store's encoding, on every retry of the batch.
    odd = "tail \udcff\ud800 end"
    s = kit.store
    s.put_results([_result("t", 1, "failed", reason="exit \udc80", tail=odd, final=True)])
    (got,) = s.results_of(QUEUE, "t")
    assert (got.tail, got.reason) == (odd, "exit \udc80")


def test_failed_and_cancelled_listings_do_not_read_every_attempt(kit: Kit) -> None:
    s = kit.store
    s.put_results([_result(f"ok{i}", 1, "succeeded", final=True) for i in range(50)]
                  + [_result("bad", 1, "failed", final=True)])
    kit.calls.clear()
    assert [r.task_id for r in s.results(QUEUE, "failed")] == ["bad"]
    query = " ".join(kit.calls)
    # the listing reads the "x:" partition alone, never the attempts of "r:"
    assert ("x%3A" in query or "x:" in query) and "r%3A" not in query
    if kit.kind == "sqlite":
        assert "'r:" not in query
    assert s.results(QUEUE, "succeeded") and s.results(QUEUE, "cancelled") == []


def test_a_corrected_record_leaves_the_failed_listing(kit: Kit) -> None:
    """A refused settlement: the worker wrote "failed, final", then the same key again as
    lock-lost; the listing of failures must not keep the first version."""
    s = kit.store
    s.put_results([_result("t", 2, "failed", final=True, exit_status=1)])
    s.put_results([_result("t", 2, "lock-lost", when=NOW + 1, exit_status=1)])
    assert s.results(QUEUE, "failed") == []
    assert [(r.attempt, r.outcome, r.final) for r in s.results_of(QUEUE, "t")] == [
        (2, "lock-lost", False)]
    s.put_results([_result("u", 1, "cancelled"), _result("u", 1, "lock-lost")])
    assert s.results(QUEUE, "cancelled") == []


def test_indexed_results_are_purged_and_counted_once(kit: Kit) -> None:
    s = kit.store
    s.put_results([_result("a", 1, "failed"), _result("b", 1, "cancelled"),
                   _result("c", 1, "succeeded")])
    assert s.purge(NOW + 8 * DAY).results == 3
    assert s.results(QUEUE) == [] and s.results(QUEUE, "failed") == []


def test_audit_records_newest_first_and_purged_after_90_days(kit: Kit) -> None:
    s = kit.store
    for i, (action, detail) in enumerate((("pause", ""), ("cancel", "t1 t2"),
                                           ("requeue", "t1"))):
        s.put_audit(AuditRecord(queue=QUEUE, seq=new_seq(NOW + i), who="alice@dashboard",
                                action=action, detail=detail, when=NOW + i))
    s.put_audit(AuditRecord(queue="other", seq=new_seq(NOW), who="bob", action="clear",
                            detail="", when=NOW))
    assert [(a.action, a.detail) for a in s.audits(QUEUE)] == [
        ("requeue", "t1"), ("cancel", "t1 t2"), ("pause", "")]
    assert [a.action for a in s.audits(QUEUE, limit=2)] == ["requeue", "cancel"]
    assert s.audits(QUEUE, limit=0) == [] and [a.who for a in s.audits("other")] == ["bob"]
    assert s.purge(NOW + 89 * DAY).audits == 0
    assert s.purge(NOW + 91 * DAY).audits == 4
    assert s.audits(QUEUE) == []


def test_history_points_by_minute_last_write_wins_purged_after_7_days(kit: Kit) -> None:
    s = kit.store
    m0 = NOW - NOW % 60
    for i in range(5):  # one every minute, the newest last
        s.put_history(HistoryPoint(queue=QUEUE, minute=m0 + 60 * i,
                                   depth={"pending": i, "running": 1}, succeeded=i, failed=0))
    s.put_history(HistoryPoint(queue="other", minute=m0, depth={"queued": 9},
                               succeeded=None, failed=None))
    # a second dashboard writes minute 3 again: one row, the last write's
    s.put_history(HistoryPoint(queue=QUEUE, minute=m0 + 180, depth={"pending": 30},
                               succeeded=None, failed=None))
    since = s.history(QUEUE, m0 + 125)  # from the minute that holds it on
    assert [(p.minute, p.depth, p.succeeded) for p in since] == [
        (m0 + 120, {"pending": 2, "running": 1}, 2), (m0 + 180, {"pending": 30}, None),
        (m0 + 240, {"pending": 4, "running": 1}, 4)]
    assert len(s.history(QUEUE, 0)) == 5
    assert [p.depth for p in s.history("other", 0)] == [{"queued": 9}]
    assert s.purge(m0 + 7 * DAY - 1).history == 0
    assert s.purge(m0 + 7 * DAY + 61).history == 3  # minutes 0 and 1 of QUEUE, "other"'s
    assert [p.minute for p in s.history(QUEUE, 0)] == [m0 + 120, m0 + 180, m0 + 240]


# ----------------------------------------------------------------------------- unique keys
def test_a_unique_key_is_claimed_once(kit: Kit) -> None:
    from supervisor.fleet.control.base import UniqueClaim

    s = kit.store
    key = "nightly/report #1:a"  # characters a key part must escape
    assert s.get_claim(QUEUE, key) is None
    assert s.create_claim(UniqueClaim(QUEUE, key, "t1", NOW)) is True
    assert s.create_claim(UniqueClaim(QUEUE, key, "t2", NOW + 1)) is False
    assert s.create_claim(UniqueClaim("other", key, "t3", NOW)) is True  # per queue
    got = s.get_claim(QUEUE, key)
    assert got is not None and (got.task_id, got.when, got.key) == ("t1", NOW, key)
    assert got.etag
    # a second instance sees the same claim
    other = kit.make()
    seen = other.get_claim(QUEUE, key)
    assert seen is not None and seen.task_id == "t1"
    other.close()


def test_replacing_a_claim_is_conditional_on_its_etag(kit: Kit) -> None:
    from supervisor.fleet.control.base import UniqueClaim

    s = kit.store
    assert s.create_claim(UniqueClaim(QUEUE, "k", "t1", NOW))
    read = s.get_claim(QUEUE, "k")
    assert read is not None
    # two pushes read the same claim; only the first replace wins
    assert s.replace_claim(UniqueClaim(QUEUE, "k", "t2", NOW + 5), read.etag) is True
    assert s.replace_claim(UniqueClaim(QUEUE, "k", "t3", NOW + 6), read.etag) is False
    now = s.get_claim(QUEUE, "k")
    assert now is not None and (now.task_id, now.when) == ("t2", NOW + 5)
    assert now.etag != read.etag
    s.release_claim(QUEUE, "k", "t2")
    assert s.replace_claim(UniqueClaim(QUEUE, "k", "t4", NOW + 7), now.etag) is False


def test_a_claim_is_released_only_by_its_task_and_purged_after_7_days(kit: Kit) -> None:
    from supervisor.fleet.control.base import UniqueClaim

    s = kit.store
    assert s.create_claim(UniqueClaim(QUEUE, "k", "t1", NOW))
    s.release_claim(QUEUE, "k", "t0")  # an older holder's late release: kept
    held = s.get_claim(QUEUE, "k")
    assert held is not None and held.task_id == "t1"
    s.release_claim(QUEUE, "k", "t1")
    assert s.get_claim(QUEUE, "k") is None
    s.release_claim(QUEUE, "k", "t1")  # gone already: no error
    assert s.create_claim(UniqueClaim(QUEUE, "k", "t2", NOW + 1))
    assert s.purge(NOW + 6 * DAY).claims == 0
    kept = s.get_claim(QUEUE, "k")
    assert kept is not None and kept.task_id == "t2"
    # Older than a message can live: over whatever it names (a push would take it over).
    assert s.purge(NOW + 1 + 7 * DAY + 1).claims == 1
    assert s.get_claim(QUEUE, "k") is None
