"""Issue 15, the worker side: worker records, cancel, pause/resume, drain/stop commands and
signed control records, against real supervisors on a SQLite queue (control tables in the
queue's own file) and on a PostgreSQL queue (control tables in its schema, issue 29).
Records are written through the ControlStore API, as jobq-ctl does."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from supervisor.core.signing import load_key
from supervisor.fleet.control import Cancel, Command, QueueFlag, new_seq
from supervisor.fleet.control.base import ControlStore
from supervisor.fleet.control.signing import sign
from supervisor.fleet.control.sqlite import SqliteControlStore
from tests.conftest import marked_processes, term_stamp, wait_for

pytestmark = pytest.mark.timeout(90)

Q = "default"
FAST = ("--control-interval", "1", "--heartbeat-interval", "1")
BOUND = 1.0 + 2.0  # control interval + 2 s


def _store(fenv) -> ControlStore:
    url = getattr(fenv, "url", None)
    if url is not None:
        from supervisor.fleet.control.postgres import PostgresControlStore

        return PostgresControlStore(url, timeout=10.0)
    return SqliteControlStore(str(fenv.db), busy_timeout=10.0)


def _status(fenv, task_id: str) -> str:
    """The task's state in the queue's own table (SQLite: ``status``, PostgreSQL: ``state``)."""
    job = fenv.job(task_id)
    return job.get("status") or job.get("state")


def _workers(fenv) -> dict:
    store = _store(fenv)
    try:
        return {w.id: w for w in store.workers(Q)}
    finally:
        store.close()


def _put(fenv, record) -> None:
    store = _store(fenv)
    try:
        if isinstance(record, Cancel):
            store.put_cancel(record)
        elif isinstance(record, QueueFlag):
            store.put_flag(record)
        else:
            store.put_command(record)
    finally:
        store.close()


def _cancel(task_id: str, grace: float = 30.0, reason: str = "operator says so") -> Cancel:
    return Cancel(queue=Q, task_id=task_id, reason=reason, who="alice@ops", when=time.time(),
                  grace=grace)


def _command(worker: str, action: str) -> Command:
    now = time.time()
    return Command(queue=Q, worker=worker, seq=new_seq(now), action=action, who="bob@ops",
                   when=now)


def _trap_marker(tmp: Path, name: str) -> tuple[str, Path, Path]:
    """A task that prints a line, then on SIGTERM writes a marker and exits 0; it also ends
    (exit 0) once ``<name>.release`` exists."""
    marker, ready = tmp / f"{name}.term", tmp / f"{name}.ready"
    cmd = (f"{term_stamp(marker)}; echo output-of-{name}; "
           f"touch {ready}; while [ ! -e {tmp / (name + '.release')} ]; do sleep 0.1; done")
    return cmd, marker, ready


def test_worker_record_lists_running_tasks_and_is_deleted_on_clean_exit(fenv):
    fenv.push("sleep 60", "sleep 60")
    sup = fenv.supervisor("-n", "3", "--worker-id", "w-rec", *FAST)
    wait_for(lambda: len(getattr(_workers(fenv).get("w-rec"), "tasks", ())) == 2, 30,
             what="worker record with two tasks")
    rec = _workers(fenv)["w-rec"]
    assert (rec.state, rec.slots_used, rec.slots_total) == ("running", 2, 3)
    assert rec.pid == sup.pid and rec.queue == Q and rec.interval == 1.0
    now = time.time()
    assert abs(rec.heartbeat - now) < 10
    for task in rec.tasks:
        assert task.cmd == "sleep 60" and task.attempt == 1 and task.pid
        assert task.lease_expires is not None and task.lease_expires > now - 5
        assert task.started <= now
    assert {t.pid for t in rec.tasks} <= {p.pid for p in marked_processes()}
    sup.signal(signal.SIGTERM)
    assert sup.wait(30) == 0
    assert "w-rec" not in _workers(fenv)


def test_cancel_running_task_terms_it_and_fails_it_as_cancelled(fenv):
    cmd, marker, ready = _trap_marker(fenv.tmp, "t")
    (task_id,) = fenv.push(cmd)
    sup = fenv.supervisor("--worker-id", "w-c", "--max-attempts", "3", *FAST)
    wait_for(ready.exists, 30, what="task running")
    t0 = time.time()
    _put(fenv, _cancel(task_id))
    wait_for(marker.exists, 10, what="SIGTERM marker")
    assert float(marker.read_text()) - t0 < BOUND
    wait_for(lambda: _status(fenv, task_id) == "failed", 15, what="failed state")
    job = fenv.job(task_id)
    assert job["attempt"] == 1, "a cancelled task is not retried"
    assert job["reason"].startswith("cancelled by alice@ops at ")
    assert "operator says so" in job["reason"]
    listed = fenv.ctl("failed").stdout
    assert task_id in listed and "cancelled" in listed
    assert "output-of-t" in (job["output_tail"] or "")
    store = _store(fenv)
    try:
        wait_for(lambda: store.results(Q, "cancelled"), 10, what="result record")
        (res,) = store.results(Q, "cancelled")
    finally:
        store.close()
    assert (res.task_id, res.attempt, res.worker) == (task_id, 1, "w-c")
    assert "output-of-t" in res.tail
    sup.signal(signal.SIGTERM)
    assert sup.wait(30) == 0
    assert "cancelled=1" in sup.log() and "failed=0" in sup.log()


def test_cancel_of_a_task_ignoring_sigterm_kills_it_at_the_grace(fenv):
    ready = fenv.tmp / "ready"
    (task_id,) = fenv.push(f"trap '' TERM; touch {ready}; sleep 600 & wait; sleep 600")
    sup = fenv.supervisor("--worker-id", "w-g", *FAST)
    wait_for(ready.exists, 30, what="task running")
    procs = [p for p in marked_processes() if p.pid != sup.pid]
    _put(fenv, _cancel(task_id, grace=2.0))
    sup.wait_log("cancelled: sending SIGTERM", 10)
    t_term = time.time()
    wait_for(lambda: _status(fenv, task_id) == "failed", 20, what="killed at the grace")
    dead = time.time()
    assert dead - t_term >= 2.0 - 0.3, "killed before the grace"
    assert dead - t_term < 2.0 + 4.0
    assert not any(p.is_running() and p.status() != "zombie" for p in procs)
    assert fenv.job(task_id)["reason"].startswith("cancelled")
    sup.signal(signal.SIGTERM)
    assert sup.wait(30) == 0


def test_pending_task_cancelled_before_any_worker_starts_never_runs(fenv):
    ran = fenv.tmp / "ran"
    cancelled_id, other_id = fenv.push(f"touch {ran}", "true")
    _put(fenv, _cancel(cancelled_id, reason="not wanted"))
    sup = fenv.supervisor("--worker-id", "w-p", "--exit-when-empty", *FAST)
    assert sup.wait(60) == 0
    assert not ran.exists()
    job = fenv.job(cancelled_id)
    assert _status(fenv, cancelled_id) == "failed"
    assert job["reason"].startswith("cancelled by alice@ops")
    assert _status(fenv, other_id) == "succeeded"
    assert "cancelled=1" in sup.log()


def test_pause_stops_intake_and_resume_restarts_it(fenv):
    # Two workers: a pause holds every worker of the queue, not only the one that is busy.
    sups = [fenv.supervisor("-n", "2", "--worker-id", w, "--poll-interval", "0.2", *FAST)
            for w in ("w-pa", "w-pb")]
    wait_for(lambda: {"w-pa", "w-pb"} <= set(_workers(fenv)), 30, what="worker records")
    long_cmd, _, long_ready = _trap_marker(fenv.tmp, "long")
    (long_id,) = fenv.push(long_cmd)
    wait_for(long_ready.exists, 30, what="long task running")
    _put(fenv, QueueFlag(queue=Q, paused=True, who="carol", when=time.time()))
    wait_for(lambda: {w.state for w in _workers(fenv).values()} == {"paused"}, BOUND + 2,
             what="both workers paused")
    started = fenv.tmp / "started"
    (new_id,) = fenv.push(f"touch {started}")
    t0 = time.monotonic()
    while time.monotonic() < t0 + 3.0:  # a window in which nothing may start
        assert not started.exists(), "a task started while the queue was paused"
        time.sleep(0.1)
    assert _status(fenv, new_id) == "pending"
    assert _status(fenv, long_id) == "running", "a running task goes on while paused"
    (fenv.tmp / "long.release").touch()  # and finishes normally
    wait_for(lambda: _status(fenv, long_id) == "succeeded", 30, what="long task done")
    assert not started.exists() and _status(fenv, new_id) == "pending"
    _put(fenv, QueueFlag(queue=Q, paused=False, who="carol", when=time.time()))
    wait_for(started.exists, BOUND + 2, what="intake after resume")
    for sup in sups:
        sup.signal(signal.SIGTERM)
        assert sup.wait(30) == 0


@pytest.mark.parametrize("action", ["drain", "stop"])
def test_drain_and_stop_act_on_the_named_worker_only(fenv, action):
    cmds = [_trap_marker(fenv.tmp, n) for n in ("a", "b")]
    ids = fenv.push(*(c for c, _, _ in cmds))
    target = fenv.supervisor("--worker-id", "w-target", *FAST)
    wait_for(lambda: any(r.exists() for _, _, r in cmds), 30, what="first task running")
    other = fenv.supervisor("--worker-id", "w-other", *FAST)
    wait_for(lambda: all(r.exists() for _, _, r in cmds), 30, what="both tasks running")
    mine = next(t.id for t in wait_for(lambda: _workers(fenv)["w-target"].tasks, 10))
    _put(fenv, _command("w-target", action))
    if action == "drain":
        wait_for(lambda: _workers(fenv)["w-target"].state == "draining", BOUND + 2,
                 what="draining")
        time.sleep(1.0)  # a window in which the draining worker must not touch its task
        assert target.proc.poll() is None, "a draining worker lets its task finish"
        (fenv.tmp / f"{'ab'[ids.index(mine)]}.release").touch()
    assert target.wait(30) == 0
    marker = cmds[ids.index(mine)][1]
    if action == "drain":
        assert not marker.exists(), "a drained task is not signalled"
        assert _status(fenv, mine) == "succeeded"
        assert "drained by bob@ops" in target.log()
    else:
        assert marker.exists(), "the named worker's task got SIGTERM"
        job = fenv.job(mine)
        assert (_status(fenv, mine), job["attempt"]) == ("pending", 0), "requeued, not counted"
    assert other.proc.poll() is None, "the other worker is unaffected"
    theirs = ids[1 - ids.index(mine)]
    assert not cmds[ids.index(theirs)][1].exists()
    assert "w-target" not in _workers(fenv) and "w-other" in _workers(fenv)
    store = _store(fenv)
    try:
        assert store.poll(Q, "w-target").commands == (), "the command was acknowledged"
    finally:
        store.close()
    other.signal(signal.SIGTERM)
    assert other.wait(30) == 0


def test_with_signing_keys_only_signed_cancels_count(fenv):
    key_file = fenv.tmp / "key"
    key_file.write_bytes(b"k" * 32)
    key_file.chmod(0o600)
    key = load_key(str(key_file))
    cmd, marker, ready = _trap_marker(fenv.tmp, "s")
    (task_id,) = fenv.ctl("push", "--signing-key-file", str(key_file), "-c", cmd).stdout.split()
    sup = fenv.supervisor("--worker-id", "w-s", "--signing-key-file", str(key_file), *FAST)
    wait_for(ready.exists, 30, what="task running")
    _put(fenv, _cancel(task_id, reason="unsigned"))
    sup.wait_log("signature unsigned", 10)
    time.sleep(BOUND)  # the unsigned cancel had its chance to act; it must not have
    assert not marker.exists()
    _put(fenv, sign(_cancel(task_id, reason="signed"), key))
    wait_for(marker.exists, 10, what="signed cancel carried out")
    wait_for(lambda: _status(fenv, task_id) == "failed", 15, what="failed state")
    assert "signed" in fenv.job(task_id)["reason"]
    sup.signal(signal.SIGTERM)
    assert sup.wait(30) == 0
