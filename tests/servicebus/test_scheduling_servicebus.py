"""Issue 18 items 2-6 on Service Bus, against the AMQP test broker (which honours
``x-opt-scheduled-enqueue-time`` and, when a queue has it on, duplicate detection by message
id, as Service Bus does): a delay is a scheduled message, a unique key is the message id,
priorities are refused with exit 2 and one line."""

from __future__ import annotations

import json
import time

import pytest

from tests.conftest import wait_for

pytestmark = [pytest.mark.servicebus, pytest.mark.timeout(90)]
POLL = 0.5


def test_a_delayed_task_is_a_scheduled_message(sb_env) -> None:
    sb_env.supervisor("-n", "2", "--poll-interval", str(POLL))
    warm = sb_env.tmp / "warm"
    sb_env.push(f"touch {warm}")
    wait_for(warm.exists, 60, what="the worker to run a first task")
    started = sb_env.tmp / "started"
    t0 = time.time()
    [tid] = sb_env.push(f"date +%s.%N > {started}", extra=("--delay", "3s"))
    t1 = time.time()
    [held] = [m for m in sb_env.broker.messages("work") if m.message_id == tid]
    not_before = json.loads(held.body)["jobq_not_before"]
    assert t0 + 3 <= not_before <= t1 + 3
    # held by the broker, not delivered; peek shows it with its time -- when the whole peek
    # ran before that time (a slow jobq-ctl start under load may peek after it)
    peeked = sb_env.ctl("peek").stdout
    if time.time() < not_before:
        assert "delayed until" in peeked
    wait_for(lambda: started.exists() and started.read_text().strip(), 30,
             what="the delayed task to start")
    at = float(started.read_text().split()[0])
    assert at >= not_before, at - not_before
    assert at <= not_before + POLL + 1.0, f"started {at - not_before:.2f}s after its time"
    [delivered] = [e for e in sb_env.broker.events("deliver") if e.wall >= t0]
    assert delivered.wall >= not_before
    print(f"service bus: delayed task started {at - not_before:.3f}s after its time")


def test_unique_key_is_the_message_id_with_duplicate_detection(sb_env) -> None:
    sb_env.broker.create_queue("work", duplicate_window=600)
    first = sb_env.ctl("push", "-c", "true", "--unique-key", "nightly")
    second = sb_env.ctl("push", "-c", "echo again", "--unique-key", "nightly")
    assert first.stdout.split() != second.stdout.split()  # the sender cannot tell
    assert "duplicate detection" in second.stderr
    [message] = sb_env.broker.messages("work")
    assert message.message_id == "nightly"
    assert len(sb_env.broker.events("duplicate")) == 1
    # the hash of command, env and cwd: the same command twice is one message
    sb_env.ctl("push", "-c", "echo x", "-c", "echo x", "-c", "echo y", "--unique")
    assert len(sb_env.broker.messages("work")) == 3


def test_without_duplicate_detection_both_are_queued(sb_env) -> None:
    sb_env.ctl("push", "-c", "true", "--unique-key", "k")
    sb_env.ctl("push", "-c", "true", "--unique-key", "k")
    assert [m.message_id for m in sb_env.broker.messages("work")] == ["k", "k"]


@pytest.mark.parametrize("value", ["9", "5", "0"])
def test_priorities_are_refused(sb_env, value: str) -> None:
    res = sb_env.ctl("push", "-c", "true", "--priority", value, check=False)
    assert res.returncode == 2, res.stderr
    [line] = res.stderr.splitlines()
    assert line.startswith("jobq-ctl: error: --priority: servicebus") and "queue" in line
    assert sb_env.broker.messages("work") == []


@pytest.mark.timing  # times the limit
def test_a_task_timeout_fails_the_attempt_at_its_limit(sb_env) -> None:
    start, term = sb_env.tmp / "start", sb_env.tmp / "term"
    sb_env.ctl("push", "-c", f"date +%s.%N > {start}; trap 'date +%s.%N > {term}; exit 3' "
               "TERM; sleep 30 & wait", "--timeout", "2s", "--max-attempts", "1")
    sup = sb_env.supervisor("--task-time-limit", "20", "--kill-timeout", "2",
                            "--exit-when-empty")
    assert sup.wait(60) == 4, sup.log()[-3000:]
    ran = float(term.read_text().split()[0]) - float(start.read_text().split()[0])
    assert 1.8 <= ran <= 3.5, ran
    [rec] = sb_env.failed_json()
    assert rec["reason"].startswith("time limit 2s exceeded"), rec["reason"]
