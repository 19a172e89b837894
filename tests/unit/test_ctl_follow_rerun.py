"""The follower (ctl_follow.py) and an attempt that runs again under the same number after a
release that did not count it (preemption, a worker's stop): the output store called its
output complete, its record said requeued, then the same attempt runs on.  The real stores and
a fake clock, as in test_ctl_output.py."""

from __future__ import annotations

import io
from dataclasses import replace

import pytest

from supervisor.ctl.output_commands import logs
from supervisor.fleet.output.base import RERUN
from supervisor.ops.follow import RESULT_GRACE
from tests.fakes.follow import key, ns, result

MARK = RERUN.format(attempt=1).encode()


def run_again(w, task: str, text: bytes, started: float) -> None:
    """What the worker of the second run does first: its record, then its output."""
    w.control.put_result(replace(result(task, 1, "running", False), started=started))
    w.out.reopen(key(task, 1))
    w.out.append(key(task, 1), MARK + text)


@pytest.mark.parametrize("one_attempt", [False, True], ids=["chained", "--attempt 1"])
def test_a_requeued_attempt_that_runs_again_is_followed_to_its_real_end(world, one_attempt):
    w = world
    w.jobs["r1"] = "running"
    w.control.put_result(result("r1", 1, "running", False))
    w.out.append(key("r1", 1), b"one\n")
    # SIGTERM: the worker stores the rest, completes the output, records "requeued".
    w.fake.at(2.0, lambda: (w.out.finish(key("r1", 1)), w.control.put_result(
        result("r1", 1, "requeued", False, signal=15))))
    w.fake.at(8.0, lambda: run_again(w, "r1", b"two\n", started=2.0e9))
    w.fake.at(12.0, lambda: w.out.append(key("r1", 1), b"three\n"))
    w.fake.at(14.0, lambda: (w.out.finish(key("r1", 1)), w.control.put_result(
        replace(result("r1", 1, "succeeded", True, 0), started=2.0e9))))
    out, err = io.BytesIO(), io.StringIO()
    assert logs(ns("r1", follow=True, attempt=1 if one_attempt else None), w.src, out,
                err) == 0
    assert out.getvalue() == b"one\n" + MARK + b"two\nthree\n"
    assert err.getvalue().splitlines() == ["requeued",
                                           "== attempt 1 runs again ==", "exit status 0"]
    assert 14.0 <= w.fake.now < 16.0


@pytest.mark.parametrize("one_attempt", [False, True], ids=["chained", "--attempt 1"])
def test_a_missed_requeue_record_still_reads_the_second_run(world, one_attempt):
    """The second run's "running" record replaced "requeued" before the follower looked, and
    the run prints only after RESULT_GRACE: its bytes alone bring the follower back."""
    w = world
    w.jobs["r2"] = "running"
    w.control.put_result(result("r2", 1, "running", False))
    w.out.append(key("r2", 1), b"one\n")
    w.out.finish(key("r2", 1))
    w.control.put_result(replace(result("r2", 1, "running", False), started=2.0e9))
    late = RESULT_GRACE + 5
    w.fake.at(late, lambda: (w.out.reopen(key("r2", 1)),
                             w.out.append(key("r2", 1), MARK + b"two\n")))
    w.fake.at(late + 2, lambda: (w.out.finish(key("r2", 1)), w.control.put_result(
        replace(result("r2", 1, "failed", True, 4), started=2.0e9))))
    out, err = io.BytesIO(), io.StringIO()
    assert logs(ns("r2", follow=True, attempt=1 if one_attempt else None), w.src, out,
                err) == 1  # exit by how it ended: failed
    assert out.getvalue() == b"one\n" + MARK + b"two\n"
    assert err.getvalue().splitlines() == ["exit status 4"]


def test_a_requeued_attempt_that_comes_back_counted_is_followed_as_the_next(world):
    """The release was refused (lock lost): the task comes back as attempt 2, and attempt 1's
    output is not read again."""
    w = world
    w.jobs["r3"] = "running"
    w.out.append(key("r3", 1), b"one\n")
    w.out.finish(key("r3", 1))
    w.control.put_result(result("r3", 1, "requeued", False, signal=15))
    w.fake.at(3.0, lambda: w.control.put_result(result("r3", 1, "lock-lost", False)))
    w.fake.at(6.0, lambda: (w.out.append(key("r3", 2), b"two\n"), w.out.finish(key("r3", 2)),
                            w.control.put_result(result("r3", 2, "succeeded", True, 0))))
    out, err = io.BytesIO(), io.StringIO()
    assert logs(ns("r3", follow=True), w.src, out, err) == 0
    assert out.getvalue() == b"one\ntwo\n"
    assert err.getvalue().splitlines() == ["requeued", "== attempt 2 ==",
                                           "exit status 0"]
