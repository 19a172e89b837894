"""ops/follow.py with a store that pushes (fleet/output/base.Watchable, PostgreSQL's NOTIFY):
a pushed write makes its follower look at once instead of at its next check, and a push ends
the real clock's wait between rounds.  On the fake clock and the real stores of
tests/fakes/follow.py; the end-to-end latencies: tests/postgres/test_output_push.py."""

from __future__ import annotations

import threading
import time

from supervisor.ops.follow import POLL_MAX, Clock, Follower, run
from tests.fakes.follow import result


class FakePushes:
    """A TaskWatch whose flags the test sets."""

    def __init__(self) -> None:
        self.flags: set[str] = set()

    def changed(self, task_id: str) -> bool:
        if task_id in self.flags:
            self.flags.discard(task_id)
            return True
        return False

    def close(self) -> None:
        pass


def test_a_pushed_result_ends_a_wait_at_once_a_polled_one_at_the_next_check(world):
    w = world
    for task in ("pushed", "polled"):
        w.jobs[task] = "running"
    pushes = FakePushes()

    def end(task: str) -> None:
        w.control.put_result(result(task, 1, "succeeded", True, 0))
        pushes.flags.add(task)

    ended: dict[str, float] = {}
    for task, watch in (("pushed", pushes), ("polled", None)):
        start = w.fake.now
        w.fake.at(start + 2.0, lambda task=task: end(task))
        f = Follower(w.src, task, None, lambda text: None, check_every=5.0)
        run([f], w.src.clock, lambda text: None, watch)  # type: ignore[arg-type]
        assert f.done and f.final is not None and f.final.outcome == "succeeded"
        ended[task] = w.fake.now - start
    # (``run`` returns in the round the follower is done, with no sleep after it; the
    # fake clock runs the write at the end of the sleep it falls in)
    assert ended["pushed"] <= 2.0 + POLL_MAX
    assert ended["polled"] >= 5.0  # the next check, 5 s after the first


def test_a_push_ends_the_real_clocks_wait_and_is_cleared():
    clock = Clock()
    timer = threading.Timer(0.05, clock.wake.set)
    timer.start()
    began = time.monotonic()
    clock.sleep(60)
    assert time.monotonic() - began < 30
    assert not clock.wake.is_set()  # the next wait waits again
    timer.join()
