"""The Service Bus backend through the real commands, against the AMQP test broker.

jobq-ctl and jobq-supervisor run as subprocesses with JOBQ_CONNECTION_STRING; the broker runs
in this process, so its event times (time.monotonic) compare directly with ours.
"""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import psutil
import pytest

from tests.conftest import wait_for
from tests.integration.helpers import death_time, ready_count, term_times, write_recorder

from .broker import DEAD_LETTER

pytestmark = [pytest.mark.servicebus, pytest.mark.timeout(90)]


def _lines(path: Path) -> list[str]:
    return path.read_text().split() if path.exists() else []


def _kinds(broker, seq: int | None = None) -> list[str]:
    return [e.kind for e in broker.events() if e.kind != "peek" and (seq is None or e.seq == seq)]


def _death_monotonic(procs: list[psutil.Process], timeout: float) -> float | None:
    """time.monotonic() when none of ``procs`` is alive any more (polled every 10 ms)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        alive = []
        for p in procs:
            try:
                if p.status() != psutil.STATUS_ZOMBIE:
                    alive.append(p)
            except psutil.NoSuchProcess:
                pass
        if not alive:
            return time.monotonic()
        time.sleep(0.01)
    return None


def test_fifty_tasks_run_once_each(sb_env):
    out = sb_env.tmp / "out"
    ids = sb_env.push(*[f"echo $JOBQ_TASK_ID >> {out}" for _ in range(50)])
    assert len(ids) == 50
    assert sb_env.ctl("size").stdout.strip() == "50"
    started = time.monotonic()
    sup = sb_env.supervisor("-n", "4", "--exit-when-empty")
    assert sup.wait(60) == 0, sup.log()
    assert sorted(_lines(out)) == sorted(ids)  # each exactly once
    assert sb_env.broker.active_count("work") == 0
    assert _kinds(sb_env.broker).count("complete") == 50
    assert _kinds(sb_env.broker).count("deliver") == 50
    assert time.monotonic() - started < 30
    assert "succeeded=50" in sup.log()


def test_long_task_keeps_its_lock_through_renewals(sb_env):
    broker = sb_env.broker
    broker.create_queue("work", lock_duration=3)
    out = sb_env.tmp / "out"
    sb_env.push(f"sleep 9.5; echo done >> {out}")
    sup = sb_env.supervisor("--lock-duration", "3", "--exit-when-empty")
    # A second worker polls all along: it must never get the message.
    other = sb_env.supervisor("--lock-duration", "3", "--exit-when-empty", name="other")
    assert sup.wait(40) == 0, sup.log()
    assert other.wait(20) == 0, other.log()
    assert _lines(out) == ["done"]
    assert _kinds(broker).count("deliver") == 1
    assert len(broker.events("renew")) >= 6
    assert broker.events("lock_expired") == []
    assert broker.active_count("work") == 0


@pytest.mark.timing  # asserts a 1 s bound
def test_lock_lost_on_renewal_kills_at_once_and_the_broker_redelivers(sb_env):
    broker = sb_env.broker
    broker.create_queue("work", lock_duration=3)
    out = sb_env.tmp / "out"
    sb_env.push(f'echo "$JOBQ_ATTEMPT" >> {out}; '
                f'if [ "$JOBQ_ATTEMPT" = 1 ]; then sleep 1000; fi; echo ok >> {out}')
    sup = sb_env.supervisor("--lock-duration", "3", "--exit-when-empty")
    wait_for(lambda: _lines(out) == ["1"] and sb_env.tasks(), 30, what="first attempt")
    wait_for(lambda: broker.events("renew"), 10, what="a successful renewal")
    procs = sb_env.tasks()
    broker.fail_renewals(True)
    wait_for(lambda: broker.events("renew_failed"), 10, what="a refused renewal")
    failed_at = broker.events("renew_failed")[0].time
    dead = _death_monotonic(procs, 5)
    broker.fail_renewals(False)
    assert dead is not None, "task survived the lost lock"
    assert dead - failed_at < 1.0, f"killed {dead - failed_at:.2f}s after the lock was lost"
    # Nothing settled the first delivery: the lock ran out at the broker.
    wait_for(lambda: broker.events("lock_expired"), 10, what="lock expiry")
    assert sup.wait(30) == 0, sup.log()
    assert _lines(out) == ["1", "2", "ok"]
    kinds = _kinds(broker)
    assert kinds.index("lock_expired") < kinds.index("complete")
    assert kinds.count("complete") == 1 and "abandon" not in kinds and "deadletter" not in kinds
    assert "lock lost" in sup.log()


def test_unresponsive_broker_task_dies_before_the_lock_expires(sb_env):
    broker = sb_env.broker
    broker.create_queue("work", lock_duration=4)
    out = sb_env.tmp / "out"
    sb_env.push(f'echo "start $JOBQ_ATTEMPT $(date +%s.%N)" >> {out}; '
                f'if [ "$JOBQ_ATTEMPT" = 1 ]; then sleep 1000; fi')
    sup = sb_env.supervisor("--lock-duration", "4", "--exit-when-empty")
    wait_for(lambda: out.exists() and sb_env.tasks(), 30, what="first attempt")
    other = sb_env.supervisor("--lock-duration", "4", "--exit-when-empty", name="other")
    wait_for(lambda: broker.events("renew"), 10, what="a successful renewal")
    procs = sb_env.tasks()
    broker.freeze()
    (info,) = broker.messages("work")  # no renewal gets through from now on
    assert info.locked
    dead = death_time(procs, 10)  # wall clock, like the broker's locked_until
    assert dead is not None, "task survived the unresponsive broker"
    assert dead < info.locked_until, f"killed {dead - info.locked_until:.2f}s after lock expiry"
    wait_for(lambda: broker.events("lock_expired"), 10, what="lock expiry at the broker")
    broker.unfreeze()
    assert sup.wait(40) == 0, sup.log()
    assert other.wait(40) == 0, other.log()
    runs = [line.split() for line in out.read_text().splitlines()]
    # Attempt 2 or 3: a delivery that reached an SDK receiver whose receive call had already
    # given up (frames queued during the freeze) lapses there and counts a delivery too.
    assert len(runs) == 2 and runs[0][1] == "1" and runs[1][1] in ("2", "3"), runs
    assert float(runs[1][2]) > dead, "the second run started before the first one died"
    assert broker.active_count("work") == 0
    assert _kinds(broker).count("complete") == 1


def test_failing_task_is_dead_lettered_listed_and_requeued(sb_env):
    broker = sb_env.broker
    (task_id,) = sb_env.push("echo boom; exit 7")
    sup = sb_env.supervisor("--max-attempts", "2", "--retry-delay", "0", "--exit-when-empty")
    assert sup.wait(30) == 4, sup.log()  # batch ended with a failed task
    (dead,) = broker.messages("work", DEAD_LETTER)
    assert dead.dead_letter_reason.startswith("exit status 7")
    assert "attempt 2 of 2" in dead.dead_letter_reason
    assert "exit_status=7 attempts=2" in dead.dead_letter_error_description
    assert dead.dead_letter_error_description.rstrip().endswith("boom")
    (record,) = sb_env.failed_json()
    assert (record["id"], record["attempts"], record["exit_status"]) == (task_id, 2, 7)
    assert record["command"] == "echo boom; exit 7" and "boom" in record["output_tail"]
    assert sb_env.ctl("status").stdout.split() == ["pending=0", "failed=1"]
    assert sb_env.ctl("requeue", "--all-failed").stdout.strip() == "requeued 1"
    assert broker.dead_letter_count("work") == 0
    (back,) = broker.messages("work")
    assert json.loads(back.body)["id"] == task_id and back.delivery_count == 0
    assert sb_env.ctl("clear").stdout.strip() == "deleted 1"
    assert broker.active_count("work") == 0


def test_poison_messages_are_dead_lettered_and_the_worker_goes_on(sb_env):
    broker = sb_env.broker
    out = sb_env.tmp / "out"
    broker.send("work", b"not json at all", message_id="p1")
    broker.send("work", json.dumps({"version": 1, "id": "x", "kwargs": "{}"}), message_id="p2")
    broker.send("work", json.dumps({"version": 9, "kwargs": json.dumps({"cmd": "true"})}),
                message_id="p3")
    broker.send("work", b"\xff\xfe binary")
    envfile = sb_env.tmp / "env"
    (good,) = sb_env.push(f"env > {envfile}; echo ok >> {out}")
    sup = sb_env.supervisor("--exit-when-empty")
    assert sup.wait(30) == 4, sup.log()
    assert _lines(out) == ["ok"]
    reasons = sorted(m.dead_letter_reason for m in broker.messages("work", DEAD_LETTER))
    assert len(reasons) == 4
    assert any("not JSON" in r for r in reasons)
    assert any("no command" in r for r in reasons)
    assert any("unknown envelope version 9" in r for r in reasons)
    assert broker.active_count("work") == 0
    assert {r["id"] for r in sb_env.failed_json()} >= {"p1", "p2", "p3"}
    # The task saw its id, never the supervisor's credentials.
    text = envfile.read_text()
    assert f"JOBQ_TASK_ID={good}" in text
    assert "CONNECTION_STRING" not in text and "SharedAccessKey" not in text


def test_sigterm_requeues_without_using_an_attempt(sb_env):
    broker = sb_env.broker
    rec = write_recorder(sb_env.tmp)
    marks, seen = sb_env.tmp / "t", sb_env.tmp / "attempts"
    (task_id,) = sb_env.push(f'echo "$JOBQ_ATTEMPT" >> {seen}; {rec} {marks} 1')
    sup = sb_env.supervisor("--lock-duration", "4")
    wait_for(lambda: ready_count(marks) == 1, 30, what="task ready")
    t0 = time.time()
    sup.signal(signal.SIGTERM)
    wait_for(lambda: term_times(marks), 10, what="SIGTERM delivered")
    assert term_times(marks)[0] - t0 < 1.0
    assert sup.wait(30) == 0, sup.log()
    assert "preempted" in sup.log()
    (again,) = broker.messages("work")
    assert again.delivery_count == 0 and not again.locked
    assert again.application_properties.get("jobq_prior_attempts") == 0
    body = json.loads(again.body)
    assert (body["id"], body["jobq_preemptions"]) == (task_id, 1)
    assert _kinds(broker).count("complete") == 1  # the original, after the copy was sent
    # The next run is attempt 1 again.
    sup2 = sb_env.supervisor("--lock-duration", "4", "--exit-when-empty", name="second")
    wait_for(lambda: ready_count(marks) == 2, 30, what="task ready again")
    sup2.signal(signal.SIGTERM)
    assert sup2.wait(30) == 0
    assert _lines(seen) == ["1", "1"]


@pytest.mark.timing  # times the kill
def test_task_ignoring_sigterm_is_killed_after_kill_timeout_and_requeued(sb_env):
    sb_env.push("trap '' TERM; sleep 1000 & sleep 1000")
    sup = sb_env.supervisor("--kill-timeout", "2", "--lock-duration", "6")
    wait_for(lambda: len(sb_env.tasks()) >= 3, 30, what="task running")
    procs = sb_env.tasks()
    t0 = time.time()
    sup.signal(signal.SIGTERM)
    dead = death_time(procs, 20)
    assert dead is not None, "task survived the kill timeout"
    assert 2.0 - 0.05 <= dead - t0 < 5.0
    assert sup.wait(30) == 0
    assert "SIGKILL" in sup.log()
    (again,) = sb_env.broker.messages("work")
    assert again.application_properties.get("jobq_prior_attempts") == 0
    assert not again.locked


def test_read_only_ctl_command_on_a_missing_queue_is_exit_1(capsys) -> None:
    """Service Bus creates no queue: a mistyped one is "does not exist", exit 1, one line --
    as on SQLite and Storage Queue (issue 14) -- not a configuration error."""
    from supervisor.ctl.main import ctl_entry as ctl_main
    from tests.servicebus.broker import ServiceBusTestBroker
    from tests.servicebus.conftest import SECRET_KEY

    with ServiceBusTestBroker(auto_create_queues=False) as broker:
        broker.create_queue("known")
        conn = (f"Endpoint=sb://127.0.0.1:{broker.port};SharedAccessKeyName=test;"
                f"SharedAccessKey={SECRET_KEY};UseDevelopmentEmulator=true")
        rc = ctl_main(["--backend", "servicebus", "--connection-string", conn,
                       "--queue", "missing", "peek"])
    err = capsys.readouterr().err
    assert rc == 1, err
    assert len(err.strip().splitlines()) == 1 and "does not exist" in err, err
