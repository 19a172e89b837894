"""Fakes for the decision layer's unit tests (watchdog, settlement, lifecycle): a task's
process, its output, a Signaller that models processes as plain data instead of signalling
anything, and RunningTasks built over them (the clock: tests/fakes/clock.py; the lease that
records how it was settled: tests/fakes/lease.py).
"""

from __future__ import annotations

import signal
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from supervisor.worker.keeper import LeaseKeeper
from supervisor.worker.process import Signaller, TaskProcess
from supervisor.worker.watchdog import RunningTask, Watchdog
from tests.fakes.clock import FakeClock
from tests.fakes.lease import FakeLease

T0 = 5000.0  # where the ``clock`` fixture (tests/unit/conftest.py) starts


class FakePopen:
    def __init__(self, pid: int = 0, returncode: int | None = None) -> None:
        self.pid = pid
        self.returncode = returncode


class FakeOutput:
    """A task's captured output (``TaskOutput.text``)."""

    def __init__(self, text: str = "") -> None:
        self._text = text

    def text(self) -> str:
        return self._text


@dataclass(eq=False)
class FakeProc:
    """What the decision layer reads of a TaskProcess; the group never really exists."""

    pid: int
    pgid: int
    marker: str
    popen: FakePopen = field(default_factory=FakePopen)
    returncode: int | None = None
    output: FakeOutput | None = None

    def group_alive(self) -> bool:
        return True


class FakeSignaller(Signaller):
    """Processes as data, for the watchdog (its one thread, or a test calling tick()).

    ``groups``: process groups with members left.  ``trees``: marker -> pids of the task
    outside its group.  ``orphans``: pid -> marker of children of ours (adopted orphans).
    A signal in ``fatal`` ends whatever it reaches; by default only SIGKILL, so a task that
    ignores SIGTERM stays.  Every signal sent is recorded in ``sent`` as
    (``"group"`` or ``"pids"``, pgid or frozenset of pids, signal, clock()).
    """

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.groups: set[int] = set()
        self.trees: dict[str, set[int]] = {}
        self.orphans: dict[int, str] = {}
        self.fatal: set[int] = {signal.SIGKILL}
        self.sent: list[tuple[str, Any, int, float]] = []
        self.tree_walks = 0

    def signal_group(self, pgid: int, sig: int) -> bool:
        self.sent.append(("group", pgid, sig, self.clock()))
        alive = pgid in self.groups
        if alive and sig in self.fatal:
            self.groups.discard(pgid)
        return alive

    def signal_pids(self, pids: Iterable[int], sig: int) -> int:
        pids = frozenset(pids)
        if not pids:
            return 0
        self.sent.append(("pids", pids, sig, self.clock()))
        live = {p for p in pids if self._alive(p)}
        if sig in self.fatal:
            for tree in self.trees.values():
                tree -= live
            for pid in live:
                self.orphans.pop(pid, None)
        return len(live)

    def group_alive(self, pgid: int) -> bool:
        return pgid in self.groups

    def group_running(self, pgid: int) -> bool:
        return pgid in self.groups

    def task_trees(self, tasks: Iterable[TaskProcess],
                   shell_pids: set[int]) -> dict[str, set[int]]:
        self.tree_walks += 1
        out = {}
        for t in tasks:
            adopted = {p for p, m in self.orphans.items() if m == t.marker}
            out[t.marker] = (self.trees.get(t.marker, set()) | adopted) - shell_pids - {t.pid}
        return out

    def adopted(self, markers: set[str], exclude: set[int]) -> list[int]:
        return [p for p, m in self.orphans.items() if m in markers and p not in exclude]

    def _alive(self, pid: int) -> bool:
        return pid in self.orphans or any(pid in tree for tree in self.trees.values())


_pids = iter(range(40000, 50000))


def make_task(clock: FakeClock, task_id: str = "t1", *, lease: FakeLease | None = None,
              granted: float = 2700.0, time_limit_at: float | None = None,
              attempt: int = 1, task: Any = None) -> RunningTask:
    """A RunningTask started at ``clock.now`` with a fake process (pid = pgid) and a real
    LeaseKeeper (fake clock, thread not started) over ``lease``."""
    pid = next(_pids)
    keeper = LeaseKeeper(lease if lease is not None else FakeLease(), task_id,
                         t_sent=clock.now, granted=granted, renew_interval=granted / 3,
                         clock=clock)
    return RunningTask(task_id=task_id, attempt=attempt,
                       proc=FakeProc(pid=pid, pgid=pid, marker=f"m-{task_id}-{pid}"),
                       keeper=keeper, started=clock.now, time_limit_at=time_limit_at,
                       lease=keeper.lease, task=task)


class RecordingWatchdog(Watchdog):
    """A real Watchdog whose signals go to a FakeSignaller (``fake``).  ``sent`` lists
    (task_id, signal, now) for every signal to a task's process group."""

    def __init__(self, **kwargs) -> None:
        self.fake = FakeSignaller(kwargs["clock"])
        self.names: dict[int, str] = {}  # pgid -> task_id of every task ever added
        super().__init__(signaller=self.fake, **kwargs)

    def add(self, rt: RunningTask) -> None:
        self.names[rt.proc.pgid] = rt.task_id
        super().add(rt)

    @property
    def sent(self) -> list[tuple[str, int, float]]:
        return [(self.names[pgid], sig, t)
                for what, pgid, sig, t in self.fake.sent if what == "group"]

    def signals(self, task_id: str = "t1") -> list[tuple[int, float]]:
        return [(sig, t) for tid, sig, t in self.sent if tid == task_id]


def make_dog(clock: FakeClock, *, kill_timeout: float = 10.0,
             lock_lost_behavior: str = "sigkill") -> RecordingWatchdog:
    return RecordingWatchdog(kill_timeout=kill_timeout, lock_lost_behavior=lock_lost_behavior,
                             clock=clock)


def run_until(dog: Watchdog, clock: FakeClock, end: float, step: float = 0.25) -> None:
    """Tick repeatedly while the clock moves to ``end`` in small steps."""
    while clock.now < end:
        dog.tick()
        clock.now = min(end, clock.now + step)
    dog.tick()
