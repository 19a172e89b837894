"""Issue 5 §3-4 (cron batch runs, drain, task logs) on the SQLite backend."""

from __future__ import annotations

import signal
import time

import pytest

from tests.conftest import wait_for

pytestmark = pytest.mark.timeout(90)


def test_lock_file_second_run_exits_0_at_once(env):
    lock = env.tmp / "run.lock"
    env.push("sleep 30")
    first = env.supervisor("--lock-file", str(lock))
    wait_for(lambda: env.rows("SELECT status FROM jobs") == [("running",)], 20,
             what="first run busy")
    t0 = time.monotonic()
    second = env.supervisor("--lock-file", str(lock), "--exit-when-empty")
    assert second.wait(30) == 0
    assert time.monotonic() - t0 < 10
    assert f"another run holds {lock}" in second.log()
    assert "started pid=" not in second.log()
    first.signal(signal.SIGTERM)
    assert first.wait(30) == 0
    # the lock dies with its holder: the next run gets it
    env.ctl("clear")
    third = env.supervisor("--lock-file", str(lock), "--exit-when-empty")
    assert third.wait(30) == 0
    assert "another run holds" not in third.log()


def test_exit_status_and_summary_line(env):
    env.push("true", "true")
    sup = env.supervisor("--exit-when-empty")
    assert sup.wait(30) == 0
    assert "summary: succeeded=2 failed=0" in sup.log()
    env.push("exit 1", extra=("--max-attempts", "1"))
    env.push("true")
    sup = env.supervisor("--exit-when-empty")
    assert sup.wait(30) == 4
    line = [ln for ln in sup.log().splitlines() if "summary:" in ln][0]
    assert "succeeded=1 failed=1" in line and "exit=4" in line and "duration=" in line


def test_sigusr1_drains(env):
    marks, go = env.tmp / "done", env.tmp / "go"
    # runs until the test says so: a fixed sleep could end before the drain under load, and
    # then the next task would start legitimately
    [running] = env.push(f"while [ ! -e {go} ]; do sleep 0.05; done; touch {marks}")
    sup = env.supervisor("-n", "1")
    wait_for(lambda: env.job(running)["status"] == "running", 20, what="task running")
    [waiting] = env.push("true")
    sup.signal(signal.SIGUSR1)
    sup.wait_log("draining")
    go.touch()
    assert sup.wait(30) == 0
    assert marks.exists(), "the running task must finish, not be killed"
    assert env.job(running)["status"] == "succeeded"
    assert env.job(waiting)["status"] == "pending", "no new task may start while draining"
    assert "draining" in sup.log()


def test_task_log_dir(env):
    logs = env.tmp / "tasklogs"
    logs.mkdir()
    [tid] = env.push("echo one; echo two >&2; exit 1", extra=("--max-attempts", "2"))
    sup = env.supervisor("--exit-when-empty", "--task-log-dir", str(logs), "--retry-delay", "0")
    assert sup.wait(30) == 4
    for attempt in (1, 2):
        text = (logs / f"{tid}.{attempt}.log").read_text()
        assert text == "one\ntwo\n"


def test_task_log_dir_unwritable_still_runs_task(env):
    [tid] = env.push("echo fine")
    # A missing directory is created at start (test_worker_exit_contract.py); here the file
    # itself cannot be opened: a directory stands where it would be.
    (env.tmp / "logs" / f"{tid}.1.log").mkdir(parents=True)
    sup = env.supervisor("--exit-when-empty", "--task-log-dir", str(env.tmp / "logs"))
    assert sup.wait(30) == 0
    assert env.job(tid)["status"] == "succeeded"
    assert "cannot open task log" in sup.log()


def test_task_log_dir_id_cannot_escape_the_directory(env):
    from supervisor.backends.sqlite.backend import SqliteBackend
    from supervisor.core.task import Task

    logs = env.tmp / "tasklogs"
    logs.mkdir()
    backend = SqliteBackend(str(env.db), "default", "test")
    backend.push([Task(cmd="echo sneaky", id="../../escaped")])
    backend.close()
    sup = env.supervisor("--exit-when-empty", "--task-log-dir", str(logs))
    assert sup.wait(30) == 0
    assert not (env.tmp.parent / "escaped.1.log").exists()
    [written] = list(logs.iterdir())
    assert written.read_text() == "sneaky\n" and written.name.endswith(".1.log")
