"""The watchdog's signals through the Signaller, and the leftovers of an exited shell:
SIGTERM, then SIGKILL after LEFTOVER_GRACE, then clean (fake clock, fake Signaller)."""

from __future__ import annotations

import signal

import pytest

from supervisor.worker.watchdog import LEFTOVER_GRACE, RunningTask
from tests.fakes.clock import FakeClock
from tests.fakes.worker import T0, RecordingWatchdog, make_dog, make_task, run_until

pytestmark = pytest.mark.timeout(30)

TERM, KILL = signal.SIGTERM, signal.SIGKILL


# --------------------------------------------------------------------------- the signaller
def test_signals_reach_the_group_and_every_process_that_left_it(clock) -> None:
    """Time limit, then escalation: each signal goes to the group and to the task's pids
    outside it, as the Signaller finds them."""
    dog = make_dog(clock, kill_timeout=10.0)
    rt = make_task(clock, time_limit_at=T0 + 30)
    dog.fake.trees[rt.proc.marker] = {7001, 7002}
    dog.add(rt)
    run_until(dog, clock, T0 + 40)
    left = frozenset({7001, 7002})
    assert dog.fake.sent == [("group", rt.proc.pgid, TERM, T0 + 30), ("pids", left, TERM, T0 + 30),
                             ("group", rt.proc.pgid, KILL, T0 + 40), ("pids", left, KILL, T0 + 40)]


def test_lock_loss_spares_the_group_of_a_reaped_shell_once_it_is_empty(clock) -> None:
    """A shell already reaped (returncode set) whose group is gone: its pgid may belong to
    somebody else by now, so only the pids found for the task are signalled."""
    dog = make_dog(clock)
    rt = make_task(clock)
    rt.proc.popen.returncode = 0
    dog.fake.trees[rt.proc.marker] = {7003}
    dog.add(rt)
    rt.keeper.lock_lost.set()
    dog.tick()
    assert dog.fake.sent == [("pids", frozenset({7003}), KILL, T0)]
    dog.fake.groups.add(rt.proc.pgid)  # a member left in the group: the group is signalled
    dog.signal_tasks([rt], KILL)
    assert ("group", rt.proc.pgid, KILL, T0) in dog.fake.sent


# --------------------------------------------------------------------------- leftovers
def exited_task(dog: RecordingWatchdog, clock: FakeClock, *, group_alive: bool) -> RunningTask:
    """A task whose shell was reaped at ``clock.now``; its group is left alive if asked."""
    rt = make_task(clock)
    rt.proc.popen.returncode = rt.proc.returncode = 0
    rt.exited_at = clock.now
    if group_alive:
        dog.fake.groups.add(rt.proc.pgid)
    dog.add(rt)
    return rt


def test_leftover_group_gets_sigterm_then_sigkill_after_the_grace(clock) -> None:
    dog = make_dog(clock)
    dog.fake.fatal = set()  # the group ignores SIGTERM and outlives even SIGKILL a while
    rt = exited_task(dog, clock, group_alive=True)
    pgid = rt.proc.pgid
    assert dog.tick() == pytest.approx(0.1)  # busy: checked again soon
    assert dog.fake.sent == [("group", pgid, TERM, T0)]
    assert dog.cleanup_busy and not rt.clean.is_set()
    run_until(dog, clock, T0 + LEFTOVER_GRACE - 0.01, step=0.1)
    assert dog.fake.sent == [("group", pgid, TERM, T0)]  # no SIGKILL within the grace
    clock.now = T0 + LEFTOVER_GRACE
    dog.tick()
    assert dog.fake.sent[1] == ("group", pgid, KILL, T0 + LEFTOVER_GRACE)
    assert not rt.clean.is_set() and dog.cleaned_count == 0  # the group is still there
    dog.fake.groups.clear()  # now everything is gone
    clock.now += 0.1
    dog.tick()
    assert rt.clean.is_set() and dog.cleaned_count == 1 and not dog.cleanup_busy
    assert all(sig == KILL for _what, _pgid, sig, _t in dog.fake.sent[1:])
    sent = len(dog.fake.sent)
    run_until(dog, clock, clock.now + 10)
    assert len(dog.fake.sent) == sent and dog.cleaned_count == 1


def test_leftover_orphans_outside_the_group_are_found_and_killed(clock) -> None:
    dog = make_dog(clock)
    rt = exited_task(dog, clock, group_alive=False)
    dog.fake.orphans = {7010: rt.proc.marker}
    dog.fake.trees[rt.proc.marker] = {7011}  # a child of the orphan
    dog.tick()
    pids = frozenset({7010, 7011})
    assert dog.fake.sent == [("pids", pids, TERM, T0)]
    run_until(dog, clock, T0 + LEFTOVER_GRACE)
    assert dog.fake.sent == [("pids", pids, TERM, T0), ("pids", pids, KILL, T0 + LEFTOVER_GRACE)]
    clock.now += 0.1
    dog.tick()
    assert rt.clean.is_set() and dog.cleaned_count == 1


def test_exited_task_with_nothing_left_is_clean_at_once_without_a_tree_walk(clock) -> None:
    dog = make_dog(clock)
    other = make_task(clock, "other")
    dog.fake.orphans = {7020: other.proc.marker}  # somebody else's: no walk for this one
    rt = exited_task(dog, clock, group_alive=False)
    dog.tick()
    assert rt.clean.is_set() and dog.cleaned_count == 1 and not dog.cleanup_busy
    assert dog.fake.sent == [] and dog.fake.tree_walks == 0
