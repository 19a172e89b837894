"""Issue 15, the jobq-ctl side on SQLite: workers, cancel, pause/resume, drain/stop, status
--json, signing and the one-line errors -- real jobq-ctl processes on a real queue file.  The
worker side is not started: worker records are put into the store as a worker's control
thread would, and the records jobq-ctl writes are read back from the store."""

from __future__ import annotations

import getpass
import json
import os
import socket
import sqlite3
import subprocess
import time
from pathlib import Path

import pytest

from supervisor.backends.sqlite.backend import SqliteBackend
from supervisor.core.signing import load_key
from supervisor.core.task import Task
from supervisor.fleet.control.base import worker_partition
from supervisor.fleet.control.records import TaskInfo, WorkerRecord
from supervisor.fleet.control.signing import verify
from supervisor.fleet.control.sqlite import SqliteControlStore
from tests import ctl_server
from tests.conftest import command
from tests.integration.helpers import one_error_line

QUEUE = "jobs"
WHO = f"{getpass.getuser()}@{socket.gethostname()}"


def ctl(db: Path, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("JOBQ_")}
    return ctl_server.run([*command("jobq-ctl"), "--sqlite-path", str(db), "--queue", QUEUE,
                           *args], env=env, timeout=timeout)


@pytest.fixture
def queue(tmp_path: Path):
    db = tmp_path / "q.db"
    # it stands in for the queue's worker: the queue exists (served) as with a real one
    backend = SqliteBackend(str(db), QUEUE, "test-worker", serve=True)
    store = SqliteControlStore(str(db))
    yield db, backend, store
    store.close()
    backend.close()


def worker(wid: str, now: float, tasks: tuple[TaskInfo, ...] = (), state: str = "running",
           beat_age: float = 0.0) -> WorkerRecord:
    return WorkerRecord(id=wid, queue=QUEUE, host="vm7", pid=4242, version="0.15.0",
                        state=state, slots_used=len(tasks), slots_total=4, started=now - 600,
                        heartbeat=now - beat_age, interval=15.0, tasks=tasks)


def push(backend: SqliteBackend, *cmds: str) -> list[str]:
    return backend.push([Task(cmd=c) for c in cmds])


def test_workers_json_and_text_show_live_workers_and_their_tasks(queue):
    db, _, store = queue
    now = time.time()
    long_cmd = "echo " + "x" * 300
    task = TaskInfo(id="t-1", attempt=2, pid=999, started=now - 65, lease_expires=now + 600,
                    cmd=long_cmd[:200])
    store.put_worker(worker("vm7:1:aa", now, (task,)))
    store.put_worker(worker("vm7:2:bb", now, state="draining"))
    store.put_worker(worker("vm8:3:cc", now, beat_age=46))  # > 3 heartbeat intervals
    res = ctl(db, "workers", "--json")
    assert res.returncode == 0, res.stderr
    shown = json.loads(res.stdout)
    assert [w["id"] for w in shown] == ["vm7:1:aa", "vm7:2:bb"]
    first = shown[0]
    for key in ("id", "host", "pid", "state", "slots", "last_heartbeat", "tasks", "version",
                "started"):
        assert key in first, key
    assert (first["host"], first["pid"], first["state"]) == ("vm7", 4242, "running")
    assert first["slots"] == {"used": 1, "total": 4}
    assert first["last_heartbeat"].endswith("Z") and "T" in first["last_heartbeat"]
    assert shown[1]["state"] == "draining"
    (t,) = first["tasks"]
    assert (t["id"], t["attempt"], t["pid"]) == ("t-1", 2, 999)
    assert t["lease_expires"].endswith("Z") and len(t["cmd"]) == 200
    assert 60 <= t["running_s"] < 120

    res = ctl(db, "workers", "--json", "--all")
    states = {w["id"]: w["state"] for w in json.loads(res.stdout)}
    assert states == {"vm7:1:aa": "running", "vm7:2:bb": "draining", "vm8:3:cc": "lost"}

    res = ctl(db, "workers")
    assert res.returncode == 0, res.stderr
    assert "vm7:1:aa" in res.stdout and "1/4" in res.stdout and "vm8:3:cc" not in res.stdout
    # 65 s when the record was written; jobq-ctl starts can take seconds each under load
    assert "t-1  attempt 2  pid 999  running 1m" in res.stdout
    assert "$ echo xxx" in res.stdout
    assert "lost" in ctl(db, "workers", "--all").stdout


def test_workers_skips_a_corrupt_record_and_none_is_not_an_error(queue):
    db, _, store = queue
    res = ctl(db, "workers")
    assert res.returncode == 0 and "no live workers" in res.stdout
    with sqlite3.connect(db) as conn:
        conn.execute("INSERT INTO control_records (part, row, kind, at, rev, doc) VALUES "
                     "(?, 'evil', 'worker', 0, 0, '{not json')", (worker_partition(QUEUE),))
    conn.close()
    store.put_worker(worker("good", time.time()))
    res = ctl(db, "workers", "--json")
    assert res.returncode == 0, res.stderr
    assert [w["id"] for w in json.loads(res.stdout)] == ["good"]
    assert "Traceback" not in res.stderr


def test_cancel_pending_task_never_runs_and_is_listed_failed_as_cancelled(queue):
    db, backend, store = queue
    ids = push(backend, "echo one", "echo two")
    res = ctl(db, "cancel", ids[0], "--reason", "wrong input")
    assert res.returncode == 0, res.stderr
    assert "will not run" in res.stdout
    cancel = store.get_cancel(QUEUE, ids[0])
    assert cancel is not None
    assert (cancel.reason, cancel.who, cancel.grace) == ("wrong input", WHO, 30.0)
    assert abs(cancel.when - time.time()) < 30 and cancel.sig is None
    # no worker can receive it any more; the other task is untouched
    leases = backend.receive(10, 60)
    assert [lease.task.id for lease in leases] == [ids[1]]  # type: ignore[attr-defined]
    failed = json.loads(ctl(db, "failed", "--json").stdout)
    assert [(f["id"], f["state"], f["cancelled_by"]) for f in failed] == [
        (ids[0], "cancelled", WHO)]
    # worded as a worker words a cancel it finds at claim time
    assert failed[0]["reason"].startswith(f"cancelled by {WHO} at ")
    assert failed[0]["reason"].endswith(": wrong input (before it started)")
    assert ctl(db, "requeue", ids[0]).returncode == 0  # requeue brings it back
    # ... for good: its cancel is forgotten, or the next worker would cancel it at claim time
    assert store.get_cancel(QUEUE, ids[0]) is None
    assert [lease.task.id for lease in backend.receive(10, 60)] == [ids[0]]  # type: ignore[attr-defined]


def test_requeue_all_failed_forgets_only_the_cancels_of_what_it_requeued(queue):
    db, backend, store = queue
    first, second = push(backend, "echo one", "echo two")
    assert ctl(db, "cancel", first).returncode == 0  # pending: failed as cancelled at once
    [lease] = backend.receive(1, 60)  # the second runs
    assert ctl(db, "cancel", second).returncode == 0  # running: recorded for its worker
    assert ctl(db, "requeue", "--all-failed").returncode == 0
    assert store.get_cancel(QUEUE, first) is not None  # cancelled: not brought back
    assert ctl(db, "requeue", "--all-failed", "--include-cancelled").returncode == 0
    assert store.get_cancel(QUEUE, first) is None
    assert store.get_cancel(QUEUE, second) is not None  # still to be acted on
    lease.complete()


def test_cancel_running_task_is_recorded_for_its_worker_with_the_grace(queue):
    db, backend, store = queue
    (tid,) = push(backend, "sleep 100")
    (lease,) = backend.receive(1, 60)
    res = ctl(db, "cancel", tid, "--grace", "5s")
    assert res.returncode == 0, res.stderr
    cancel = store.get_cancel(QUEUE, tid)
    assert cancel is not None and cancel.grace == 5.0
    # still running: its worker's control thread acts on the record, not jobq-ctl
    assert json.loads(ctl(db, "status", "--json").stdout)["counts"]["running"] == 1
    assert ctl(db, "cancel", tid, "--now").returncode == 0
    cancel = store.get_cancel(QUEUE, tid)
    assert cancel is not None and cancel.grace == 0.0
    # the worker's poll sees it
    assert [c.task_id for c in store.poll(QUEUE, "w").cancels] == [tid]
    lease.complete()


def test_cancel_errors_are_one_line(queue):
    db, backend, store = queue
    (tid,) = push(backend, "echo")
    line = one_error_line(ctl(db, "cancel", tid, "no-such-id"), 1)
    assert "no-such-id" in line
    assert store.cancels(QUEUE) == []  # nothing recorded when one id is wrong
    assert backend.size() == 1
    for bad in (["--grace", "soon"], ["--grace", "-3"], ["--cancel-ttl", "30d"]):
        one_error_line(ctl(db, "cancel", tid, *bad), 2)
    one_error_line(ctl(db, "cancel", tid, "--now", "--grace", "3"), 2)
    assert store.cancels(QUEUE) == []


def test_cancel_of_a_finished_task_records_nothing(queue):
    db, backend, store = queue
    (tid,) = push(backend, "echo")
    (lease,) = backend.receive(1, 60)
    lease.complete()
    res = ctl(db, "cancel", tid)
    assert res.returncode == 0 and "already succeeded" in res.stdout
    assert store.cancels(QUEUE) == []


def test_pause_resume_are_queue_flags_shown_by_status_and_workers(queue):
    db, backend, store = queue
    assert ctl(db, "pause").returncode == 0
    flag = store.poll(QUEUE, "w").flag
    assert flag is not None and flag.paused and flag.who == WHO
    status = json.loads(ctl(db, "status", "--json").stdout)
    assert status["paused"] is True
    assert "PAUSED" in ctl(db, "status").stdout
    store.put_worker(worker("w1", time.time()))
    assert "PAUSED" in ctl(db, "workers").stdout
    assert json.loads(ctl(db, "workers", "--json").stdout)[0]["queue_paused"] is True
    assert ctl(db, "resume").returncode == 0
    flag = store.poll(QUEUE, "w").flag
    assert flag is not None and not flag.paused
    assert json.loads(ctl(db, "status", "--json").stdout)["paused"] is False
    assert "PAUSED" not in ctl(db, "workers").stdout


def test_drain_and_stop_send_a_command_to_the_named_live_worker_only(queue):
    db, _, store = queue
    now = time.time()
    for wid in ("w1", "w2"):
        store.put_worker(worker(wid, now))
    store.put_worker(worker("gone", now, beat_age=100))
    assert ctl(db, "drain", "w1").returncode == 0
    assert ctl(db, "stop", "w2").returncode == 0
    (cmd1,) = store.poll(QUEUE, "w1").commands
    (cmd2,) = store.poll(QUEUE, "w2").commands
    assert (cmd1.action, cmd1.worker, cmd1.who) == ("drain", "w1", WHO)
    assert (cmd2.action, cmd2.worker) == ("stop", "w2")
    assert cmd1.seq != cmd2.seq
    for wid in ("nobody", "gone"):
        assert wid in one_error_line(ctl(db, "drain", "w1", wid), 1)
    assert len(store.poll(QUEUE, "w1").commands) == 1  # nothing sent on an error


def test_status_json_keeps_its_shape_and_adds_oldest_pending_age_and_paused(queue):
    db, backend, _ = queue
    empty = json.loads(ctl(db, "status", "--json").stdout)
    assert empty["oldest_pending_age_s"] is None and empty["paused"] is False
    push(backend, "echo a")
    time.sleep(0.01)
    push(backend, "sleep 50")
    (lease,) = backend.receive(1, 60)  # the oldest runs; "sleep 50" is the oldest pending
    with sqlite3.connect(db) as conn:  # pushed an hour ago
        conn.execute("UPDATE jobs SET created_at=created_at-3600 WHERE status='pending'")
    conn.close()
    res = ctl(db, "status", "--json")
    assert res.returncode == 0, res.stderr
    status = json.loads(res.stdout)
    assert set(status) >= {"counts", "running", "oldest_pending_age_s", "paused"}
    assert status["counts"]["running"] == 1 and status["counts"]["pending"] == 1
    assert 3600 <= status["oldest_pending_age_s"] < 3700
    (run,) = status["running"]
    assert run["worker"] == "test-worker" and run["locked_until"].endswith("Z")
    assert "oldest pending: 1h00m" in ctl(db, "status").stdout
    lease.complete()


def test_signed_records_verify_with_the_first_key(queue, tmp_path):
    db, backend, store = queue
    (tid,) = push(backend, "echo")
    backend.receive(1, 60)
    keys = []
    for name in ("new", "old"):
        path = tmp_path / f"{name}.key"
        path.write_text(f"secret-{name}\n")
        keys.append(load_key(str(path)))
    key_args = ["--signing-key-file", str(tmp_path / "new.key"),
                "--signing-key-file", str(tmp_path / "old.key")]
    store.put_worker(worker("w1", time.time()))
    for args in (["cancel", tid], ["pause"], ["drain", "w1"]):
        assert ctl(db, *args, *key_args).returncode == 0
    snap = store.poll(QUEUE, "w1")
    records = [snap.flag, *snap.cancels, *snap.commands]
    assert len(records) == 3
    for record in records:
        assert record is not None and record.sig is not None
        assert record.sig["kid"] == keys[0].kid
        assert verify(record, keys[:1]) is None
        assert verify(record, keys[1:]) is not None
    one_error_line(ctl(db, "pause", "--signing-key-file", str(tmp_path / "none.key")), 2)


@pytest.mark.parametrize("args", [["workers"], ["cancel", "x"], ["pause"], ["resume"],
                                  ["drain", "w"], ["stop", "w"]])
def test_without_a_control_store_every_control_command_exits_2(queue, args):
    db, _, _ = queue
    line = one_error_line(ctl(db, "--control", "off", *args), 2)
    assert "--control" in line
