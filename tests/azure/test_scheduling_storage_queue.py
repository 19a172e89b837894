"""Issue 18 items 2-6 on Storage Queue (Azurite): a delay is the initial visibility timeout
(at most 7 days); priorities and unique keys are refused with exit 2 and one line."""

from __future__ import annotations

import json
import time

import pytest

from tests.azure.test_storage_queue_worker import SqEnv
from tests.conftest import wait_for, wait_for_no_marked

pytestmark = [pytest.mark.azure, pytest.mark.timeout(120)]
POLL = 0.5


@pytest.fixture
def sq(tmp_path, azurite, queue_name):
    e = SqEnv(tmp_path, azurite.port, queue_name)
    e.ctl("clear")  # creates the queues, as any first writing command does
    yield e
    e.cleanup()
    assert not wait_for_no_marked(timeout=10)


def one_usage_line(res, option: str) -> str:
    assert res.returncode == 2, (res.returncode, res.stdout, res.stderr)
    lines = res.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"jobq-ctl: error: {option}"), res.stderr
    return lines[0]


def test_a_delayed_task_starts_after_its_delay(sq: SqEnv) -> None:
    sq.supervisor("-n", "2", "--poll-interval", str(POLL))
    warm = sq.tmp / "warm"
    sq.ctl("push", "-c", f"touch {warm}")
    wait_for(warm.exists, 60, what="the worker to run a first task")
    started = sq.tmp / "started"
    t0 = time.time()
    sq.ctl("push", "-c", f"date +%s.%N > {started}", "--delay", "3s")
    # hidden while it waits: peek shows nothing, the count includes it
    if time.time() < t0 + 2.5:
        assert json.loads(sq.ctl("peek", "--json").stdout) == []
    wait_for(lambda: started.exists() and started.read_text().strip(), 30,
             what="the delayed task to start")
    at = float(started.read_text().split()[0])
    assert at >= t0 + 3, at - t0
    # the service counts whole seconds (rounded up), then one poll, then the shell's start
    assert at <= t0 + 3 + 1 + POLL + 1.0, f"started {at - t0:.2f}s after the push"
    print(f"storage queue: delayed task started {at - t0 - 3:.3f}s after its time")


def test_seven_days_is_the_most(sq: SqEnv) -> None:
    one_usage_line(sq.ctl("push", "-c", "true", "--delay", "8d", check=False), "--delay")
    one_usage_line(sq.ctl("push", "-c", "true", "--not-before", "2099-01-01T00:00:00Z",
                          check=False), "--not-before")
    assert sq.count() == 0
    sq.ctl("push", "-c", "true", "--delay", "7d")  # the service's maximum is accepted
    assert sq.count() == 1 and json.loads(sq.ctl("peek", "--json").stdout) == []


@pytest.mark.parametrize(("args", "option", "words"), [
    (("--priority", "9"), "--priority", "several queues"),
    (("--priority", "5"), "--priority", "several queues"),
    (("--unique-key", "k"), "--unique-key", "no index"),
    (("--unique",), "--unique", "no index"),
])
def test_what_the_service_cannot_do_is_refused(sq: SqEnv, args: tuple[str, ...], option: str,
                                               words: str) -> None:
    line = one_usage_line(sq.ctl("push", "-c", "true", *args, check=False), option)
    assert "storage-queue" in line and words in line
    assert sq.count() == 0


def test_a_delayed_task_is_queued_from_its_time(sq: SqEnv) -> None:
    """The oldest pending age (status, the autoscaling gauge) of a delayed message that just
    became visible is counted from its time, not from its push 3 s before."""
    t0 = time.time()
    sq.ctl("push", "-c", "true", "--delay", "3s")
    wait_for(lambda: json.loads(sq.ctl("peek", "--json").stdout), 30,
             what="the delayed message to become visible")
    age = json.loads(sq.ctl("status", "--json").stdout)["oldest_pending_age_s"]
    since_push = time.time() - t0
    # from its time (>= t0 + 3), give or take the 0.1 s the output rounds to
    assert age is not None and age <= since_push - 3 + 0.1, (age, since_push)


def test_a_task_timeout_fails_the_attempt_at_its_limit(sq: SqEnv) -> None:
    start, term = sq.tmp / "start", sq.tmp / "term"
    sq.ctl("push", "-c", f"date +%s.%N > {start}; trap 'date +%s.%N > {term}; exit 3' TERM; "
           "sleep 30 & wait", "--timeout", "2s", "--max-attempts", "1")
    sup = sq.supervisor("--task-time-limit", "20", "--kill-timeout", "2", "--exit-when-empty",
                        "--poll-interval", "0.2")
    assert sup.wait(60) == 4, sup.log()[-3000:]
    ran = float(term.read_text().split()[0]) - float(start.read_text().split()[0])
    assert 1.8 <= ran <= 3.5, ran
    [rec] = sq.failed_records()
    assert rec["reason"].startswith("time limit 2s exceeded"), rec["reason"]
