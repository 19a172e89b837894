"""Issue 3 acceptance: the worker and jobq-ctl on --backend storage-queue against Azurite."""

from __future__ import annotations

import json
import os
import signal
import socket
import time

import pytest

from tests.azurite import queue_connection_string
from tests.conftest import marked_processes, wait_for
from tests.faults.proxy import FaultProxy
from tests.integration.helpers import death_time, ready_count, term_times, write_recorder

pytestmark = [pytest.mark.azure, pytest.mark.timeout(120)]


def test_push_50_run_each_once_and_delete(sq):
    out = sq.tmp / "ids"
    cmds = [f"echo $JOBQ_TASK_ID >> {out}" for _ in range(50)]
    sq.ctl("push", "--file", "-", input="\n".join(cmds) + "\n")
    assert int(sq.ctl("size").stdout) == 50
    sup = sq.supervisor("-n", "4", "--exit-when-empty", "--poll-interval", "0.2")
    assert sup.wait(90) == 0, sup.log()[-3000:]
    ids = out.read_text().split()
    assert len(ids) == 50 and len(set(ids)) == 50
    assert sq.count() == 0
    assert "summary: succeeded=50 failed=0" in sup.log()


def test_heartbeat_keeps_message_hidden_with_newest_pop_receipt(sq):
    # A 6 s lock renewed every 0.5 s leaves each renewal 3.5 s (lock - margin - interval)
    # before the kill deadline; with a 3 s lock it had 1.5 s, and a renewal that Azurite
    # answered later than that on a saturated CPU was applied unseen: the next one's pop
    # receipt was stale and the lease was (rightly) lost.  Polled for longer than the lock.
    [tid] = sq.ctl("push", "-c", "sleep 12").stdout.split()
    sup = sq.supervisor("--visibility-timeout", "6", "--renew-interval", "0.5",
                        "--log-level", "DEBUG", "--exit-when-empty")
    sup.wait_log("started pid=")
    other = sq.client()
    seen = []
    t_end = time.monotonic() + 9
    while time.monotonic() < t_end:  # a second worker polling the same queue
        seen += list(other.receive_messages(max_messages=32, visibility_timeout=1))
        time.sleep(0.2)
    assert seen == [], "another worker saw a leased message"
    assert sup.wait(60) == 0
    log = sup.log()
    assert log.count("Lock renewed till") >= 10
    assert "lock lost" not in log and "summary: succeeded=1" in log


@pytest.mark.timing  # asserts a 3 s bound
def test_deleted_message_kills_task_at_once(sq):
    """A definitive answer (404 MessageNotFound) kills the task group at once, unsettled."""
    sq.ctl("push", "-c", "sleep 60 & sleep 60; true")
    sup = sq.supervisor("--visibility-timeout", "30", "--renew-interval", "0.5")
    wait_for(lambda: sum(p.name() == "sleep" for p in marked_processes()) == 2, 30,
             what="task running")
    procs = [p for p in marked_processes() if p.pid != sup.pid]
    sq.client().clear_messages()  # another client takes the message away
    t0 = time.time()
    dead = death_time(procs, 10)
    assert dead is not None and dead - t0 < 3.0
    sup.wait_log("not settled")
    log = sup.log()
    assert "broker says the lease is gone" in log and "killed by SIGKILL" in log
    sup.signal(signal.SIGTERM)
    assert sup.wait(30) == 0


def test_stale_pop_receipt_after_visibility_lapse(sq):
    """The supervisor is frozen past its visibility timeout, another client takes the
    message; the moment the supervisor runs again the task dies and nothing is settled."""
    f = sq.tmp / "runs"
    sq.ctl("push", "-c", f"echo run >> {f}; sleep 60; true")
    sup = sq.supervisor("--visibility-timeout", "3", "--renew-interval", "0.5")
    wait_for(lambda: f.exists(), 30, what="task running")
    procs = [p for p in marked_processes() if p.pid != sup.pid]
    os.kill(sup.pid, signal.SIGSTOP)
    try:
        other = sq.client()
        got = wait_for(lambda: list(other.receive_messages(visibility_timeout=30)), 15,
                       what="message visible again")
    finally:
        os.kill(sup.pid, signal.SIGCONT)
    assert death_time(procs, 5) is not None
    sup.wait_log("not settled")
    # the other client still holds a valid receipt: nothing was deleted or updated
    other.delete_message(got[0])
    sup.signal(signal.SIGTERM)
    assert sup.wait(30) == 0


def test_blackhole_kills_before_visibility_expiry_and_second_worker_finishes(sq):
    runs = sq.tmp / "runs"
    sq.ctl("push", "-c", f"echo start $(date +%s.%N) >> {runs}; sleep 30; "
                         f"echo end $(date +%s.%N) >> {runs}")
    with FaultProxy(("127.0.0.1", sq.port)) as proxy:
        first = sq.supervisor("--visibility-timeout", "6", "--renew-interval", "1",
                              via_port=proxy.address[1], name="behind-proxy")
        wait_for(lambda: runs.exists(), 30, what="first run started")
        procs = [p for p in marked_processes() if p.pid != first.pid]
        proxy.blackhole()
        t_blackhole = time.time()
        second = sq.supervisor("--poll-interval", "0.1", "--visibility-timeout", "60",
                               name="direct")
        dead = death_time(procs, 20)
        assert dead is not None, "task survived the black-holed lease"
        wait_for(lambda: runs.read_text().count("end") == 1, 60, what="second run done")
        second.signal(signal.SIGTERM)
        assert second.wait(30) == 0
        lines = runs.read_text().split("\n")
        starts = [float(ln.split()[1]) for ln in lines if ln.startswith("start")]
        ends = [float(ln.split()[1]) for ln in lines if ln.startswith("end")]
        assert len(starts) == 2 and len(ends) == 1
        # The second run began only once the message was visible again, after the kill.
        assert dead < starts[1] - 0.3, (dead - t_blackhole, starts[1] - t_blackhole)
        proxy.restore()
        first.signal(signal.SIGTERM)
        assert first.wait(60) == 0
    assert "lock lost" in first.log()


def test_attempts_reach_the_limit_after_crashes(sq):
    [tid] = sq.ctl("push", "--max-attempts", "2", "-c", "kill -9 $PPID; sleep 5").stdout.split()
    for _ in range(2):
        sup = sq.supervisor("--visibility-timeout", "2", "--renew-interval", "0.5")
        assert sup.wait(60) == -signal.SIGKILL
    sup = sq.supervisor("--visibility-timeout", "2", "--poll-interval", "0.3")
    # the message reappears after its lease expires; the worker dead-letters it unrun
    wait_for(lambda: sq.count("-failed") == 1, 30, what="dead-lettered")
    sup.signal(signal.SIGTERM)
    assert sup.wait(60) == 0
    [rec] = sq.failed_records()
    assert rec["id"] == tid and "attempts exhausted" in rec["reason"]
    assert sq.count() == 0


def test_preemption_keeps_attempt_and_retry_backoff(sq):
    rec = write_recorder(sq.tmp)
    f = sq.tmp / "p"
    out = sq.tmp / "attempts"
    sq.ctl("push", "-c", f"echo $JOBQ_ATTEMPT >> {out}; exec {rec} {f} 0")
    sup = sq.supervisor("--visibility-timeout", "10", "--renew-interval", "1")
    wait_for(lambda: ready_count(f) == 1, 30, what="task running")
    sup.signal(signal.SIGTERM)
    assert sup.wait(30) == 0
    assert term_times(f)
    # the preempted task comes back at once with its attempt intact
    sq.ctl("clear", check=False)  # nothing else must be in the way: clears pending only
    sq.ctl("push", "-c", f"echo $JOBQ_ATTEMPT >> {out}; exit 1", "--max-attempts", "2")
    t0 = time.monotonic()
    sup = sq.supervisor("--exit-when-empty", "--retry-delay", "2", "--poll-interval", "0.2")
    assert sup.wait(60) == 4
    assert time.monotonic() - t0 >= 2.0  # the retry waited for its backoff
    assert out.read_text().split() == ["1", "1", "2"]


def test_poison_messages_go_to_failed_queue(sq):
    raw = sq.client()
    raw.send_message("not json at all")
    raw.send_message(json.dumps({"version": 1, "kwargs": "{}", "id": "nocmd",
                                 "num_retries": 0, "reply_requested": False}))
    raw.send_message(json.dumps({"version": 99, "kwargs": "{}", "id": "v99"}))
    sq.ctl("push", "-c", "echo fine")
    sup = sq.supervisor("--exit-when-empty", "--poll-interval", "0.2")
    assert sup.wait(60) == 4
    reasons = sorted(r["reason"] for r in sq.failed_records())
    assert len(reasons) == 3
    assert any("not JSON" in r for r in reasons)
    assert any("no command" in r for r in reasons)
    assert any("version 99" in r for r in reasons)
    assert sq.count() == 0 and "summary: succeeded=1" in sup.log()


def test_failed_requeue_clear(sq):
    [tid] = sq.ctl("push", "--max-attempts", "1", "-c", "echo oops; exit 3").stdout.split()
    sup = sq.supervisor("--exit-when-empty", "--poll-interval", "0.2")
    assert sup.wait(60) == 4
    [rec] = sq.failed_records()
    assert rec["id"] == tid and rec["exit_status"] == 3 and "oops" in rec["output_tail"]
    assert "exit status 3" in sq.ctl("failed").stdout
    assert sq.ctl("requeue", "--all-failed").stdout.strip() == "requeued 1"
    assert sq.count("-failed") == 0 and sq.count() == 1
    peek = json.loads(sq.ctl("peek", "--json").stdout)
    assert peek[0]["id"] == tid
    sq.ctl("clear")
    assert sq.count() == 0


def test_wire_format_is_ai4s_jobq_v1(sq):
    sq.ctl("push", "-c", "echo hi", "--env", "A=b")
    [msg] = list(sq.client().peek_messages())
    body = json.loads(msg.content)
    assert body["version"] == 1 and body["reply_requested"] is False
    assert isinstance(body["num_retries"], int) and body["id"]
    kwargs = json.loads(body["kwargs"])
    assert kwargs == {"cmd": "echo hi", "env": {"A": "b"}}


def test_ai4s_pushed_task_runs(sq):
    """A message as ai4s-jobq 3.x pushes it (deterministic md5 id, min_version key)."""
    out = sq.tmp / "ai4s"
    sq.client().send_message(json.dumps({
        "version": 1, "reply_requested": False, "kwargs": json.dumps({"cmd": f"echo ok > {out}"}),
        "num_retries": 0, "min_version": None, "id": "0123456789abcdef0123456789abcdef"}))
    sup = sq.supervisor("--exit-when-empty", "--poll-interval", "0.2")
    assert sup.wait(60) == 0
    assert out.read_text().strip() == "ok"


def test_secret_never_logged_or_passed_to_tasks(sq):
    out = sq.tmp / "env"
    sq.ctl("push", "-c", f"env > {out}", "--max-attempts", "1")
    sup = sq.supervisor("--exit-when-empty", "--log-level", "DEBUG", "--poll-interval", "0.2")
    assert sup.wait(60) == 0
    key = sq.conn_str.split("AccountKey=")[1].split(";")[0]
    assert key not in out.read_text() and key not in sup.log()
    help_text = sq.ctl("--help").stdout
    assert key not in help_text


def test_config_errors_exit_2(sq, azurite):
    bad_key = queue_connection_string(azurite.port, key="d3Jvbmcga2V5" * 7 + "AAAA")
    sup = sq.supervisor(env={"JOBQ_CONNECTION_STRING": bad_key})
    assert sup.wait(30) == 2
    assert len(sup.log().strip().splitlines()) == 1 and "d3Jvbmcga2V5" not in sup.log()
    both = sq.supervisor("--account-url", "https://acct.queue.core.windows.net")
    assert both.wait(30) == 2 and "exactly one" in both.log()
    bad_vis = sq.supervisor("--visibility-timeout", "700000")
    assert bad_vis.wait(30) == 2 and "604800" in bad_vis.log()


def test_backend_down_at_start_retries_with_log_lines(sq):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    sup = sq.supervisor(via_port=port)
    wait_for(lambda: sup.log().count("backend not reachable") >= 2, 30,
             what="two retry log lines")
    assert "Traceback" not in sup.log()
    sup.signal(signal.SIGTERM)
    assert sup.wait(30) != 0 or True  # no handlers yet: SIGTERM ends it
    assert sup.proc.returncode in (0, -signal.SIGTERM)


def test_kill_timeout_and_max_consecutive_failures(sq):
    sq.ctl("push", "-c", "trap '' TERM; sleep 1000; true")
    sup = sq.supervisor("--kill-timeout", "1", "--visibility-timeout", "10",
                        "--renew-interval", "1")
    sup.wait_log("started pid=")
    sup.signal(signal.SIGTERM)
    assert sup.wait(30) == 0
    assert "SIGKILL" in sup.log() and "preempted" in sup.log()
    sq.ctl("clear")
    sq.ctl("push", "-c", "exit 1", "-c", "exit 1", "-c", "exit 1")
    sup = sq.supervisor("--max-consecutive-failures", "2", "--retry-delay", "0",
                        "--poll-interval", "0.2")
    assert sup.wait(60) == 3
