"""Fakes for the decision layer's unit tests (watchdog, settlement, lifecycle): a clock (from
tests/fakes/clock.py), a task's process, a lease that records how it was settled, and a
Signaller that models processes as plain data instead of signalling anything.

Imported as a sibling module (tests/unit is not a package: pytest puts it on sys.path).
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from supervisor.worker.keeper import LeaseKeeper
from supervisor.worker.process import Signaller, TaskProcess
from supervisor.worker.watchdog import RunningTask, Watchdog
from tests.fakes.clock import FakeClock  # noqa: F401 (re-exported)

T0 = 5000.0  # where the ``clock`` fixture (conftest.py) starts


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


class FakeLease:
    """Records each settlement call as (method, arguments); never renews (the keeper gets a
    long lease, and the watchdog must never talk to the backend)."""

    def __init__(self, *, task: Any = None, attempt: int = 1, raw_body: str = "",
                 format_error: str | None = None) -> None:
        self.task = task
        self.attempt = attempt
        self.raw_body = raw_body
        self.format_error = format_error
        self.message_id = "msg-1"
        self.lock_duration = 2700.0
        self.calls: list[tuple[Any, ...]] = []
        self.refuse: Exception | None = None  # raised by every settlement call when set
        self._lock = threading.Lock()  # the keeper may settle on its own thread

    def renew(self, timeout: float) -> float:  # pragma: no cover - never driven here
        raise AssertionError("no renewal is due in these tests")

    def complete(self) -> None:
        with self._lock:
            self.calls.append(("complete",))
        if self.refuse is not None:
            raise self.refuse

    def release(self, count_attempt: bool, delay: float = 0.0) -> None:
        with self._lock:
            self.calls.append(("release", count_attempt, delay))

    def dead_letter(self, reason: str, output_tail: str, exit_status: int | None = None) -> None:
        with self._lock:
            self.calls.append(("dead_letter", reason, output_tail, exit_status))
        if self.refuse is not None:
            raise self.refuse


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
