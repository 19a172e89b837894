"""Issue 25 class 5, "every task ends visibly, with the same words everywhere", on a real
worker and a real SQLite queue, read by real ``jobq-ctl`` processes and the dashboard's Flask
app: a task cancelled while pending or backing off says ``cancelled by WHO at WHEN: WHY`` in
``push --wait``, ``logs -f``, ``result`` and the task page; ``logs -f`` and ``push --wait``
exit by the task's outcome (0 / 1 / 3); an attempt superseded by a later one is not shown
running; ``peek`` shows no stale delay; ``requeue --all-failed`` leaves cancelled tasks;
``failed --json`` and ``/api/failed`` agree field by field; the overview counts each task
once."""

from __future__ import annotations

import getpass
import json
import signal
import socket
import time
from typing import Any

import psutil
import pytest

from supervisor.backends.sqlite.backend import SqliteBackend
from supervisor.dashboard.app import create_app
from supervisor.dashboard.data import DataSource
from supervisor.fleet.control.sqlite import SqliteControlStore
from supervisor.fleet.output.files import FileOutputStore, output_dir
from tests.conftest import command, marked_processes, wait_for
from tests.integration.captured import Captured
from tests.integration.helpers import FAST, results

pytestmark = pytest.mark.timeout(180)
WHO = f"{getpass.getuser()}@{socket.gethostname()}"
Q = "default"


def start_ctl(env: Any, *args: str) -> Captured:
    return Captured.start(command("jobq-ctl") + ["--sqlite-path", str(env.db), *args],
                          cwd=env.tmp)


def dashboard(env: Any) -> Any:
    return create_app(DataSource(Q, lambda: SqliteBackend(str(env.db), Q, "dash"),
                                 lambda: SqliteControlStore(str(env.db)), None,
                                 lambda: FileOutputStore(output_dir(str(env.db))))
                      ).test_client()


def a_sleep_runs() -> bool:
    """Whether a task's ``sleep`` runs (one that ends while we look is not running)."""
    for p in marked_processes():
        try:
            if p.name() == "sleep":
                return True
        except psutil.NoSuchProcess:
            continue
    return False


def is_cancel_line(line: str, reason: str) -> bool:
    return line.startswith(f"cancelled by {WHO} at ") and line.endswith(
        f": {reason} (before it started)")


def test_a_task_cancelled_while_pending_says_so_everywhere_within_seconds(env):
    """The issue's case: push --wait said ``ID failed (no result record)`` after 12 s,
    ``logs -f`` exited 0 with no last line, ``result ID`` said no result."""
    sup = env.supervisor("--worker-id", "w-vis", *FAST)
    wait = start_ctl(env, "push", "-c", "echo never", "--delay", "600s", "--wait")
    wait_for(lambda: wait.out, 30, what="the pushed id")
    task_id = wait.out[0][1].decode().strip()
    follow = start_ctl(env, "logs", "-f", task_id)
    follow.wait_err("waiting for task", 30)
    t0 = time.monotonic()
    res = env.ctl("cancel", task_id, "--reason", "wrong input")
    assert res.stdout.strip() == f"{task_id}: cancelled (it was pending and will not run)"
    assert wait.wait(30) == 3, wait.err
    assert follow.wait(30) == 3, follow.err
    took = time.monotonic() - t0
    assert took < 8, f"the wait ended {took:.1f}s after the cancel"
    last = wait.err[-1]  # (a warning may come first: a store busy under load is retried)
    assert last.startswith(f"{task_id} ") and is_cancel_line(last[len(task_id) + 1:],
                                                              "wrong input"), last
    assert is_cancel_line(follow.err[-1], "wrong input"), follow.err
    assert follow.stdout() == b""
    (rec,) = results(env, task_id)
    assert (rec["attempt"], rec["state"], rec["final"], rec["cancelled_by"], rec["worker"],
            rec["started"]) == (1, "cancelled", True, WHO, "", None)
    assert is_cancel_line(rec["reason"], "wrong input")
    text = env.ctl("result", task_id).stdout.splitlines()
    assert text[2].split()[:2] == ["1", "cancelled"] and "final" in text[2]
    logs = env.ctl("logs", task_id)
    assert "has no output stored (cancelled by " in logs.stderr
    page = dashboard(env).get(f"/api/task/{task_id}").get_json()
    assert page["state"] == "cancelled" and is_cancel_line(page["reason"], "wrong input")
    assert [(a["state"], a["cancelled_by"]) for a in page["attempts"]] == [("cancelled", WHO)]
    assert "never" not in sup.log(), "the cancelled task never ran"
    sup.signal(signal.SIGTERM)
    assert sup.wait(30) == 0


def test_logs_follow_and_push_wait_exit_by_the_outcome(env):
    ok, bad = env.push("echo fine", "echo five; exit 5")
    sup = env.supervisor("--max-attempts", "1", *FAST)
    follows = {t: start_ctl(env, "logs", "-f", t) for t in (ok, bad)}
    assert follows[bad].wait(60) == 1, follows[bad].err
    assert follows[bad].err[-1] == "exit status 5"
    assert follows[bad].stdout() == b"five\n"
    assert follows[ok].wait(60) == 0, follows[ok].err
    wait = start_ctl(env, "push", "-c", "exit 5", "--max-attempts", "1", "--wait")
    assert wait.wait(60) == 1 and wait.err[-1].endswith(" failed: exit status 5"), wait.err
    sup.signal(signal.SIGTERM)
    assert sup.wait(30) == 0


def test_a_task_cancelled_while_backing_off_agrees_in_failed_json_and_api_failed(env):
    """Attempt 1 failed and the task waits for its retry when it is cancelled: no worker
    cancelled it, so neither listing names attempt 1's worker or output; the overview counts
    it once, as cancelled."""
    (flaky,) = env.push("echo attempt-output; exit 3")
    (broken,) = env.push("echo bad; exit 4", extra=("--max-attempts", "1"))
    sup = env.supervisor("--worker-id", "w-bo", "--retry-delay", "600", *FAST)
    wait_for(lambda: [r["state"] for r in results(env, flaky)] == ["failed"], 30,
             what="attempt 1 failed")
    wait_for(lambda: any(r["final"] for r in results(env, broken)), 30,
             what="the other task failed for good")
    env.ctl("cancel", flaky, "--reason", "give up")
    sup.signal(signal.SIGTERM)
    assert sup.wait(30) == 0
    cli = {r["id"]: r for r in json.loads(env.ctl("failed", "--json").stdout)}
    client = dashboard(env)
    resp = client.get("/api/failed")
    assert resp.status_code == 200
    api = {r["id"]: r for r in resp.get_json()["tasks"]}
    assert set(cli) == set(api) == {flaky, broken}
    for task_id in (flaky, broken):
        body = cli[task_id].pop("body")
        assert json.loads(body)["id"] == task_id
        assert cli[task_id] == api[task_id], task_id
    row = cli[flaky]
    assert (row["state"], row["worker"], row["output_tail"], row["cancelled_by"]) == (
        "cancelled", None, "", WHO)
    assert is_cancel_line(row["reason"], "give up")
    assert (cli[broken]["state"], cli[broken]["worker"], cli[broken]["exit_status"]) == (
        "failed", "w-bo", 4)
    assert "bad" in cli[broken]["output_tail"]
    page = client.get("/").get_data(as_text=True)
    assert '<td class="n" id="count-failed">1</td>' in page, page
    assert '<td class="n" id="count-cancelled">1</td>' in page


def test_requeue_all_failed_leaves_the_cancelled_tasks(env):
    """One task failed; one was cancelled while it ran (the issue's case); one was cancelled
    while pending.  ``--all-failed`` brings back only the failed one; the cancelled come
    back when named or with --include-cancelled."""
    ready = env.tmp / "ready"
    failing, running = env.push("exit 3", f"touch {ready}; sleep 600")
    (pending,) = env.push("true", extra=("--delay", "600s"))
    sup = env.supervisor("--max-attempts", "1", *FAST)
    wait_for(ready.exists, 30, what="the task running")
    env.ctl("cancel", running, "--now")
    env.ctl("cancel", pending)
    wait_for(lambda: {r[0]: r[1] for r in env.rows()} == {
        failing: "failed", running: "failed", pending: "failed"}, 30, what="all three failed")
    sup.signal(signal.SIGTERM)
    assert sup.wait(30) == 0
    assert env.ctl("requeue", "--all-failed").stdout.strip() == "requeued 1"
    assert {r[0]: r[1] for r in env.rows()} == {failing: "pending", running: "failed",
                                                pending: "failed"}
    bad = env.ctl("requeue", running, "--include-cancelled", check=False)
    assert bad.returncode == 2 and "--include-cancelled" in bad.stderr
    assert env.ctl("requeue", running).stdout.strip() == "requeued 1"
    assert env.ctl("requeue", "--all-failed", "--include-cancelled").stdout.strip() == \
        "requeued 1"
    assert {r[1] for r in env.rows()} == {"pending"}
    store = SqliteControlStore(str(env.db))
    try:
        assert store.cancels(Q) == [], "requeue forgets the cancels of what it brings back"
    finally:
        store.close()


def test_an_attempt_superseded_by_a_later_one_is_not_shown_running(env):
    """A worker with a fixed --worker-id is SIGKILLed while attempt 1 runs; the task comes
    back (short lock, stale-lock reaper) and a restarted worker of the same id runs attempt
    2: attempt 1 is worker-lost, although a live worker has its id."""
    task = 'if [ "$JOBQ_ATTEMPT" = 1 ]; then sleep 600; else echo second-run; fi'
    (task_id,) = env.push(task)
    lease = ("--lock-duration", "6", "--renew-interval", "1", "--reaper-interval", "1",
             "--stale-lock-age", "0", "--retry-delay", "0", *FAST)
    sup = env.supervisor("--worker-id", "vm-01", *lease)
    wait_for(a_sleep_runs, 30, what="attempt 1 running")
    wait_for(lambda: [r["state"] for r in results(env, task_id)] == ["running"], 10,
             what="the running record")
    sup.signal(signal.SIGKILL)
    sup.wait(10)
    wait_for(lambda: not a_sleep_runs(), 15, what="the lifeline to kill attempt 1")
    again = env.supervisor("--worker-id", "vm-01", *lease)
    got: list[dict[str, Any]] = []

    def ended() -> bool:  # the lock (6 s), a reaper pass and a start: generous under load
        got[:] = results(env, task_id)
        return len(got) == 2 and got[1]["state"] == "succeeded"
    wait_for(ended, 90, what="attempt 2 succeeded")
    first, second = got
    assert (first["attempt"], first["state"], first["final"]) == (1, "worker-lost", False)
    assert (second["state"], second["final"]) == ("succeeded", True)
    assert "running" not in env.ctl("result", task_id).stdout
    page = dashboard(env).get(f"/api/task/{task_id}").get_json()
    assert [a["state"] for a in page["attempts"]] == ["worker-lost", "succeeded"]
    again.signal(signal.SIGTERM)
    assert again.wait(30) == 0


def test_peek_shows_no_stale_delay_on_a_requeued_task(env):
    (task_id,) = env.push("echo later", extra=("--delay", "600s"))
    assert "delayed until" in env.ctl("peek").stdout
    env.ctl("cancel", task_id)
    env.ctl("requeue", task_id)
    assert env.ctl("peek").stdout.strip() == f"{task_id}  echo later"
    (shown,) = json.loads(env.ctl("peek", "--json").stdout)
    assert (shown["delayed"], shown["not_before"]) == (False, None)
    assert env.ctl("status").stdout.split()[:2] == ["pending=1", "delayed=0"]
    sup = env.supervisor("--exit-when-empty", "--poll-interval", "0.1")
    assert sup.wait(60) == 0, sup.log()
    assert env.job(task_id)["status"] == "succeeded"
