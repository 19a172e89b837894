"""The lifeline helper's deadline book and the supervisor's feed, with an injected clock."""

from __future__ import annotations

import signal

from supervisor.worker.lifeline import MAX_DELAY, DeadlineFeed, Deadlines, act_time


class FakeKeeper:
    def __init__(self, deadline: float, expires: float) -> None:
        self.deadline, self.expires = deadline, expires
        self.now = 0.0

    def lost(self) -> bool:
        return self.now >= self.deadline


def book(sig: int = signal.SIGKILL, kill_timeout: float = 0.0) -> Deadlines:
    return Deadlines(sig, kill_timeout)


def test_act_time_is_after_the_deadline_and_before_expiry():
    assert act_time(100.0, 102.0) == 101.0  # 6 s lease: margin 2 s, half of it
    assert act_time(100.0, 370.0) == 100.0 + MAX_DELAY  # 45-min lease: capped
    assert act_time(100.0, 100.0) == 100.0


def test_acts_once_at_deadline_plus_delay():
    b = book()
    b.feed(b"+42 7 100.000 102.000", 0.0)
    assert b.next_wake() == 101.0
    assert b.due(100.99) == []
    assert b.due(101.0) == [(42, signal.SIGKILL)]
    assert b.due(105.0) == []  # once
    assert b.next_wake() is None
    assert b.tasks[42].seq == b"7"


def test_renewal_just_before_the_deadline_postpones():
    b = book()
    b.feed(b"+42 7 100.000 102.000", 0.0)
    b.feed(b"=42 103.900 105.900", 99.99)  # the renewal landed 10 ms before the deadline
    assert b.due(101.0) == [] and b.due(104.8) == []
    assert b.due(104.9) == [(42, signal.SIGKILL)]


def test_unregistered_task_is_left_alone():
    b = book()
    b.feed(b"+42 7 100.000 102.000", 0.0)
    b.feed(b"-42", 50.0)
    assert b.due(200.0) == [] and b.next_wake() is None
    b.feed(b"=42 300.0 302.0", 60.0)  # a late update of a gone task is ignored
    assert 42 not in b.tasks


def test_registration_without_deadline_only_dies_with_the_supervisor():
    b = book()
    b.feed(b"+42", 0.0)
    assert 42 in b.tasks and b.next_wake() is None and b.due(1e9) == []


def test_sigterm_then_sigkill_after_kill_timeout():
    b = book(signal.SIGTERM, kill_timeout=5.0)
    b.feed(b"+42 7 100.000 102.000", 0.0)
    assert b.due(101.5) == [(42, signal.SIGTERM)]
    assert b.next_wake() == 106.5
    b.feed(b"=42 200.0 202.0", 102.0)  # too late: it was already signalled
    assert b.due(106.4) == []
    assert b.due(106.5) == [(42, signal.SIGKILL)]
    assert b.due(300.0) == [] and b.next_wake() is None


def test_kill_timeout_zero_never_escalates():
    b = book(signal.SIGTERM, kill_timeout=0.0)
    b.feed(b"+42 7 100.000 102.000", 0.0)
    assert b.due(101.0) == [(42, signal.SIGTERM)]
    assert b.next_wake() is None and b.due(1e9) == []


def test_watchdog_acting_means_no_second_sigterm_but_a_sigkill_backstop():
    b = book(signal.SIGTERM, kill_timeout=5.0)
    b.feed(b"+42 7 100.000 102.000", 0.0)
    b.feed(b"!42", 100.1)  # the supervisor saw the deadline pass: its watchdog sent SIGTERM
    assert b.due(101.0) == []
    assert b.due(105.9) == []  # the watchdog escalates at 105.0; we only after it
    assert b.due(106.0) == [(42, signal.SIGKILL)]


def test_sigkill_mode_keeps_its_backstop_after_the_watchdog():
    b = book(signal.SIGKILL, kill_timeout=5.0)
    b.feed(b"+42 7 100.000 102.000", 0.0)
    b.feed(b"!42", 100.1)
    assert b.due(101.0) == [(42, signal.SIGKILL)]  # finds the tree gone, normally


def test_torn_or_foreign_lines_are_ignored():
    b = book()
    for line in (b"", b"+", b"+x", b"+42 7 soon 102", b"=42", b"?42", b"+-1 2 3 4", b"!"):
        b.feed(line, 0.0)
    assert b.tasks == {}
    b.feed(b"+42 7 100 102", 0.0)
    b.feed(b"=42 x y", 0.0)
    assert b.tasks[42].act_at == 101.0


def test_feed_sends_deadline_with_registration_and_changes_once():
    feed = DeadlineFeed()
    keeper = FakeKeeper(100.0, 102.0)
    feed.register(42, "tok:7", keeper)
    assert feed.take(deadlines=False) == b"+42 7 100.000 102.000\n"
    assert feed.take(deadlines=True) == b""  # nothing changed
    keeper.deadline, keeper.expires = 103.5, 105.5  # a renewal
    assert feed.take(deadlines=True) == b"=42 103.500 105.500\n"
    assert feed.take(deadlines=True) == b""
    keeper.now = 103.6  # the supervisor sees the deadline pass itself
    assert feed.take(deadlines=True) == b"!42\n"
    assert feed.take(deadlines=True) == b""
    feed.unregister(42)
    keeper.deadline = 200.0
    assert feed.take(deadlines=True) == b"-42\n"


def test_feed_switched_off_for_the_bench_registers_without_deadlines(monkeypatch):
    monkeypatch.setenv("JOBQ_LIFELINE_DEADLINES", "0")  # scripts/bench's A/B only
    feed, keeper = DeadlineFeed(), FakeKeeper(100.0, 102.0)
    feed.register(42, "tok:7", keeper)
    assert feed.take(deadlines=False) == b"+42\n"  # still killed when the supervisor dies
    keeper.deadline = 103.5
    assert feed.take(deadlines=True) == b""


def test_feed_round_trips_into_the_book():
    feed, b = DeadlineFeed(), book()
    keeper = FakeKeeper(100.0, 102.0)
    feed.register(42, "tok:7", keeper)
    feed.register(43, "", None)
    keeper.deadline, keeper.expires = 110.0, 112.0
    for line in feed.take(deadlines=True).split(b"\n"):
        b.feed(line, 0.0)
    assert b.tasks[42].act_at == 111.0 and b.tasks[43].act_at == float("inf")
