"""Tasks that log their own runs, and the invariants checked on those logs.

Each task appends ``<id> <attempt> start|beat|end <epoch> <pid>`` lines to one shared file
(single ``>>`` writes of far less than 4 KiB: atomic appends).  A *run* is one (id, attempt,
shell pid); its last line is its last sign of life.
"""

from __future__ import annotations

import re
import signal
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from tests.conftest import Supervisor, marked_processes, wait_for
from tests.integration.helpers import death_time

LOCK_LOSS = re.compile(r"\[([^\]|]+)\] (?:lock lost|finished after lock loss)")


def heartbeat_cmd(log: Path, beats: int) -> str:
    """A one-line shell task: start, ``beats`` heartbeats ~0.1 s apart, end."""
    line = f'echo "$JOBQ_TASK_ID $JOBQ_ATTEMPT %s $(date +%%s.%%N) $$" >> {log}'
    return (f"{line % 'start'}; n={beats}; while [ $n -gt 0 ]; do sleep 0.1; "
            f"{line % 'beat'}; n=$((n-1)); done; {line % 'end'}")


@dataclass
class Run:
    task_id: str
    attempt: int
    pid: int
    start: float | None = None
    last: float = 0.0  # last start/beat/end
    end: float | None = None
    beats: int = 0


@dataclass
class RunReport:
    runs: dict[str, list[Run]] = field(default_factory=dict)
    overlaps: list[tuple[Run, Run]] = field(default_factory=list)  # (earlier, later)
    interrupted: int = 0  # runs without an end line

    def summary(self) -> str:
        total = sum(len(r) for r in self.runs.values())
        return (f"tasks={len(self.runs)} runs={total} interrupted={self.interrupted} "
                f"overlaps={len(self.overlaps)}")


def parse_runs(log: Path) -> RunReport:
    by_key: dict[tuple[str, int, int], Run] = {}
    text = log.read_text() if log.exists() else ""
    for line in text.splitlines():
        parts = line.split()
        assert len(parts) == 5, f"torn or foreign line in the run log: {line!r}"
        task_id, attempt, what, ts, pid = parts[0], int(parts[1]), parts[2], float(parts[3]), \
            int(parts[4])
        run = by_key.setdefault((task_id, attempt, pid), Run(task_id, attempt, pid))
        if what == "start":
            assert run.start is None, f"two starts for one run: {line!r}"
            run.start = ts
        elif what == "beat":
            run.beats += 1
        elif what == "end":
            assert run.end is None, f"two ends for one run: {line!r}"
            run.end = ts
        else:
            raise AssertionError(f"unknown line {line!r}")
        run.last = max(run.last, ts)
    report = RunReport()
    grouped: dict[str, list[Run]] = defaultdict(list)
    for run in by_key.values():
        assert run.start is not None, f"a run without a start line: {run}"
        grouped[run.task_id].append(run)
    for runs in grouped.values():
        runs.sort(key=lambda r: r.start)  # type: ignore[arg-type,return-value]
        report.interrupted += sum(r.end is None for r in runs)
        for i, earlier in enumerate(runs):
            for later in runs[i + 1:]:
                assert later.start is not None
                if later.start <= earlier.last:
                    report.overlaps.append((earlier, later))
    report.runs = dict(grouped)
    return report


def lock_loss_ids(sups: list[Supervisor]) -> set[str]:
    """Task ids some supervisor logged a lock loss for."""
    ids: set[str] = set()
    for sup in sups:
        ids.update(LOCK_LOSS.findall(sup.log()))
    return ids


def check_runs(report: RunReport, ids: list[str], sups: list[Supervisor]) -> None:
    """Every task completed; runs of one task overlap only where a lock loss was logged."""
    not_done = [i for i in ids if not any(r.end is not None for r in report.runs.get(i, []))]
    assert not not_done, f"{len(not_done)} task(s) never completed: {not_done[:5]}"
    foreign = set(report.runs) - set(ids)
    assert not foreign, f"runs of unknown tasks: {sorted(foreign)[:5]}"
    lost = lock_loss_ids(sups)
    unexplained = [(a, b) for a, b in report.overlaps if a.task_id not in lost]
    assert not unexplained, (
        "runs of one task overlapped without a logged lock loss: "
        + "; ".join(f"{a.task_id}: attempt {a.attempt} last seen {a.last:.3f} > "
                    f"attempt {b.attempt} start {b.start:.3f}" for a, b in unexplained[:5]))


@dataclass
class Lifeline:
    proc: psutil.Process
    token: str  # the JOBQ_LIFELINE prefix of this supervisor's tasks


def lifeline_of(sup: Supervisor, timeout: float = 30.0) -> Lifeline:
    """The supervisor's lifeline (its child running ``-m supervisor.worker.lifeline``)."""

    def find() -> psutil.Process | None:
        try:
            for child in psutil.Process(sup.pid).children():
                if "supervisor.worker.lifeline" in " ".join(child.cmdline()):
                    return child
        except psutil.Error:
            pass
        return None

    found = wait_for(find, timeout, what=f"lifeline of supervisor {sup.pid}\n{sup.log()}")
    assert isinstance(found, psutil.Process)
    return Lifeline(found, found.cmdline()[-1])


def gone(proc: psutil.Process) -> bool:
    try:
        return not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def assert_nothing_left(lifelines: list[Lifeline], timeout: float = 15.0) -> None:
    """No task of these supervisors is alive, and every lifeline helper has exited."""

    def ours() -> list[psutil.Process]:
        return [p for ll in lifelines for p in marked_processes(ll.token + ":")]

    deadline = time.monotonic() + timeout
    while (ours() or not all(gone(ll.proc) for ll in lifelines)) \
            and time.monotonic() < deadline:
        time.sleep(0.1)
    left = ours()
    assert not left, f"task processes alive after their supervisors: {left}"
    stuck = [ll.proc.pid for ll in lifelines if not gone(ll.proc)]
    assert not stuck, f"lifeline helpers still running: {stuck}"


def sigkill_timed(sup: Supervisor, lifeline: Lifeline, timeout: float = 15.0) -> float:
    """SIGKILL ``sup``; the seconds from the signal until no task process of it is alive
    (psutil): those alive before it, polled, then sweeps by its lifeline's marker until one
    finds none (a process spawned just before the kill counts too).  A sweep that finds none
    counts as the time it ended: a bound from above."""
    before = marked_processes(lifeline.token + ":")
    killed_at = time.time()
    sup.signal(signal.SIGKILL)
    assert sup.wait(10) == -signal.SIGKILL
    assert death_time(before, timeout) is not None, \
        f"a killed supervisor's tasks lived on: {before}"
    deadline = time.monotonic() + timeout
    while marked_processes(lifeline.token + ":"):
        assert time.monotonic() < deadline, "a killed supervisor's tasks lived on"
        time.sleep(0.01)
    return time.time() - killed_at
