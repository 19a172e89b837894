"""Issue 16, result records: real supervisors on a SQLite queue write a record per attempt
(running, then how it ended) to the control store in the queue's file, and ``jobq-ctl
result ID [--json]`` shows them.  Real shells and real signals.  Those with ``fenv`` run on
a PostgreSQL queue too (issue 29: its control store in the queue's schema)."""

from __future__ import annotations

import getpass
import signal
import socket
import subprocess
import time
from typing import Any

import pytest

from tests.conftest import command, wait_for
from tests.integration.helpers import FAST, results

pytestmark = pytest.mark.timeout(120)

WHO = f"{getpass.getuser()}@{socket.gethostname()}"


def settled(env: Any, task_id: str, n: int) -> list[dict[str, Any]]:
    """The task's records once ``n`` attempts have ended."""
    got: list[dict[str, Any]] = []

    def ended() -> bool:
        got[:] = results(env, task_id)
        return len(got) == n and all(r["state"] != "running" for r in got)
    wait_for(ended, 30, what=f"{n} ended attempts of {task_id}")
    return got


def test_success_and_a_failure_then_success(fenv):
    ok, flaky = fenv.push("echo fine", 'if [ "$JOBQ_ATTEMPT" = 1 ]; then exit 3; fi; echo 2nd')
    sup = fenv.supervisor("--max-attempts", "2", "--retry-delay", "0", "--exit-when-empty",
                         "--worker-id", "w-res", "--poll-interval", "0.1")
    assert sup.wait(60) == 0, sup.log()
    (rec,) = settled(fenv, ok, 1)
    assert {k: rec[k] for k in ("attempt", "state", "final", "exit_status", "signal",
                                "worker", "max_attempts", "cancelled_by")} == {
        "attempt": 1, "state": "succeeded", "final": True, "exit_status": 0, "signal": None,
        "worker": "w-res", "max_attempts": 2, "cancelled_by": None}
    assert rec["started"] and rec["finished"] and rec["started"] <= rec["finished"]
    assert 0 <= rec["duration_s"] < 30
    first, second = settled(fenv, flaky, 2)
    assert (first["attempt"], first["state"], first["final"], first["exit_status"]) == (
        1, "failed", False, 3)
    assert "exit status 3" in first["reason"]
    assert (second["attempt"], second["state"], second["final"], second["exit_status"]) == (
        2, "succeeded", True, 0)
    text = fenv.ctl("result", flaky).stdout.splitlines()
    assert text[0] == f"task {flaky} on queue default"
    assert "ATTEMPT" in text[1] and len(text) == 4
    assert text[2].split()[:4] == ["1/2", "failed", "exit", "3"]
    assert text[3].split()[:4] == ["2/2", "succeeded", "exit", "0"] and "final" in text[3]


def test_a_task_killed_by_a_signal_has_a_signal_and_no_exit_status(fenv):
    (task_id,) = fenv.push("echo before; kill -9 $$")
    sup = fenv.supervisor("--max-attempts", "1", "--exit-when-empty", "--poll-interval", "0.1")
    assert sup.wait(60) == 4, sup.log()  # a task failed
    (rec,) = settled(fenv, task_id, 1)
    assert (rec["state"], rec["final"], rec["exit_status"], rec["signal"]) == (
        "failed", True, None, 9)
    line = fenv.ctl("result", task_id).stdout.splitlines()[2]
    assert line.split()[:4] == ["1/1", "failed", "signal", "9"]


def test_a_running_task_then_cancelled(fenv):
    ready = fenv.tmp / "ready"
    (task_id,) = fenv.push(f"touch {ready}; sleep 600")
    sup = fenv.supervisor("--worker-id", "w-c", *FAST)
    wait_for(ready.exists, 30, what="task running")
    running: list[dict[str, Any]] = []
    wait_for(lambda: running.extend(results(fenv, task_id)) or running, 10,
             what="the running record")
    assert [(r["state"], r["final"], r["finished"], r["exit_status"]) for r in running] == [
        ("running", False, None, None)]
    assert running[0]["started"] and running[0]["worker"] == "w-c"
    fenv.ctl("cancel", task_id, "--grace", "20s", "--reason", "wrong input")
    (rec,) = settled(fenv, task_id, 1)
    assert (rec["state"], rec["final"], rec["cancelled_by"], rec["signal"]) == (
        "cancelled", True, WHO, signal.SIGTERM)
    assert "wrong input" in rec["reason"]
    assert f"cancelled by {WHO}" in fenv.ctl("result", task_id).stdout
    sup.signal(signal.SIGTERM)
    assert sup.wait(30) == 0


def test_the_attempt_of_a_sigkilled_worker_shows_as_worker_lost(env):
    """The worker dies without writing the attempt's end: once its heartbeat is stale (3
    intervals of 1 s) ``jobq-ctl result`` shows the attempt as worker-lost, not running."""
    ready = env.tmp / "ready"
    (task_id,) = env.push(f"touch {ready}; sleep 600")
    sup = env.supervisor("--worker-id", "w-k", *FAST)
    wait_for(ready.exists, 30, what="task running")
    wait_for(lambda: [r["state"] for r in results(env, task_id)] == ["running"], 10,
             what="the running record")
    sup.signal(signal.SIGKILL)
    sup.wait(10)
    shown: list[dict[str, Any]] = []
    wait_for(lambda: shown.extend(r for r in results(env, task_id)
                                  if r["state"] == "worker-lost") or shown, 30,
             what="the attempt shown as worker-lost")
    assert (shown[0]["attempt"], shown[0]["worker"], shown[0]["final"],
            shown[0]["duration_s"]) == (1, "w-k", False, None)
    assert "worker-lost" in env.ctl("result", task_id).stdout


def test_a_preempted_task_is_requeued_not_final(env):
    ready = env.tmp / "ready"
    (task_id,) = env.push(f"touch {ready}; sleep 600")
    sup = env.supervisor("--worker-id", "w-p", *FAST)
    wait_for(ready.exists, 30, what="task running")
    sup.signal(signal.SIGTERM)
    assert sup.wait(60) == 0, sup.log()
    (rec,) = settled(env, task_id, 1)
    assert (rec["attempt"], rec["state"], rec["final"], rec["signal"], rec["exit_status"]) == (
        1, "requeued", False, signal.SIGTERM, None)
    assert env.job(task_id)["status"] == "pending"


@pytest.mark.timing  # a black-holed store fails within 10 s (10.9 s once in the busy bulk phase)
def test_unknown_id_no_store_and_unreachable_store_are_one_line(env, tmp_path):
    env.push("true")
    res = env.ctl("result", "no-such-task", check=False)
    assert res.returncode == 1 and res.stdout == ""
    assert res.stderr.splitlines() == [
        "jobq-ctl: error: result: no result recorded for task 'no-such-task' in queue "
        "default (not started yet, unknown, or older than 7 days)"]
    res = env.ctl("--control", "off", "result", "x", check=False)
    assert res.returncode == 2 and len(res.stderr.splitlines()) == 1
    assert "--control" in res.stderr
    # a table endpoint nobody listens on, and one that never answers (black-holed)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        refused = s.getsockname()[1]
    with socket.socket() as hole:
        hole.bind(("127.0.0.1", 0))
        hole.listen(8)
        for port in (refused, hole.getsockname()[1]):
            conn = ("DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey=a2V5;"
                    f"QueueEndpoint=http://127.0.0.1:{port}/devstoreaccount1;"
                    f"TableEndpoint=http://127.0.0.1:{port}/devstoreaccount1")
            t0 = time.monotonic()
            res = subprocess.run([*command("jobq-ctl"), "--backend", "storage-queue", "--queue",
                                  "q", "--connection-string", conn, "result", "x"],
                                 capture_output=True, text=True, timeout=60, cwd=tmp_path)
            assert time.monotonic() - t0 < 10
            assert res.returncode == 1, res.stderr
            assert len(res.stderr.splitlines()) == 1 and "Traceback" not in res.stderr
            assert res.stderr.startswith("jobq-ctl: error: control store")


def test_a_lost_lease_is_lock_lost_and_the_next_attempt_succeeds(env):
    """The database is held (no renewal, no control write) until the lease is lost and the
    task killed; afterwards attempt 1 reads lock-lost (killed by SIGKILL), attempt 2
    succeeded."""
    from tests.conftest import marked_processes
    from tests.integration.helpers import database_held, death_time

    task = 'if [ "$JOBQ_ATTEMPT" = 1 ]; then sleep 60; else echo second-run; fi'
    (task_id,) = env.push(task)
    sup = env.supervisor("--lock-duration", "6", "--renew-interval", "1",
                         "--reaper-interval", "1", "--stale-lock-age", "0",
                         "--exit-when-empty", "--retry-delay", "0", *FAST)
    wait_for(lambda: any(p.name() == "sleep" for p in marked_processes()), 30,
             what="the first attempt running")
    procs = [p for p in marked_processes() if p.pid != sup.pid]
    wait_for(lambda: [r["state"] for r in results(env, task_id)] == ["running"], 10,
             what="the running record")
    with database_held(env.db, 15):
        assert death_time(procs, 14) is not None, "the task outlived its lease"
    assert sup.wait(60) == 0, sup.log()
    first, second = settled(env, task_id, 2)
    assert (first["state"], first["final"], first["exit_status"], first["signal"]) == (
        "lock-lost", False, None, signal.SIGKILL)
    assert (second["state"], second["final"], second["exit_status"]) == ("succeeded", True, 0)
