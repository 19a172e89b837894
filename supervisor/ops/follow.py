"""Following a task's attempts for ``jobq-ctl logs -f`` and ``push --wait/--follow``
(ctl/output_commands.py): its output from the output store (fleet/output/), how each attempt ended
from
the result records of the control store.  Main thread of jobq-ctl; nothing here starts a
thread (a store's push, ``Sources.listen``, has one of its own), and every wait is the
injected ``Clock.sleep`` (tests run it on a fake clock).

A follower (``Follower``) polls: ``read`` of the attempt it follows every POLL_MIN seconds
while output flows, backing off to POLL_MAX when nothing comes (workers flush at least every
2 s, so a printed line shows within ~3 s).  A store that pushes (PostgreSQL with NOTIFY:
``Sources.listen``) wakes the wait between rounds at each write to a followed task's output
or results, and that follower reads and looks at its records at once (workers on it flush
output every 0.2 s and results within 0.1 s: a line or an end shows within ~0.3 s); the
polling stays the backstop.  An attempt is over when its output is complete
and its result record says how it ended (waited for up to RESULT_GRACE); an attempt that
ended without completing its output (its worker died) is over when a result record or a
newer attempt says so and no byte came for ENDED_GRACE.  A result that is not ``final``
(retried, lock lost, requeued) makes the follower go on to the next attempt.

A requeued attempt (released without counting: preemption, a worker's stop) runs again under
the same number, after output the store already called complete.  So while the follower waits
for the next attempt it also watches the one it left: its record showing a new start, or
(after a requeue, or with no record) new bytes past the offset it read to, take it back to
that attempt (``== attempt N runs again ==``), where the stored output goes on behind the
store's RERUN marker.  While it waits for an attempt's result and the record says running,
new bytes take it back to reading too.

A task cancelled before an attempt ran (pending, or backing off before a retry) has no
worker to write its end: its end is derived from its cancel record (ops/task_ends.py) and printed
like a worker's, ``cancelled by WHO at WHEN: WHY (before it started)``.  On SQLite the
queue's own table is a fallback besides: a task whose job row is succeeded or failed and
which gets no final result record within RESULT_GRACE (``--control off``) ends with the job
row's status.  Azure has no such table: there only result records (and cancels) end a wait.

Exit statuses of a follow (``logs -f``) and a wait (``push --wait/--follow``), by how the task
ended (``exit_status``): 0 succeeded, 1 failed (or ended with no record saying it
succeeded), 3 cancelled; several tasks: 1 if any failed, else 3 if any was cancelled.  See
docs/architecture.rst, "Task output".
"""

from __future__ import annotations

import signal as signals
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import IO, Union

from ..backends.base import BackendError
from ..fleet.control.base import ControlStore, ControlStoreError
from ..fleet.control.records import ResultRecord
from ..fleet.output.base import AttemptKey, OutputStore, OutputStoreError, TaskWatch, Watchable
from .task_ends import read_pending_cancel

POLL_MIN = 0.5  # s between reads while output flows
POLL_MAX = 1.0  # s between reads when nothing new came
CHECK_EVERY = 1.0  # s between looks at result records / attempts of one task
RESULT_GRACE = 10.0  # s to wait for a result record (or a final one) before falling back
ENDED_GRACE = 5.0  # s of silence after a record says an attempt ended without its output
FAIL_FOR = 60.0  # s a follow or wait retries a store that fails, once it was reached
STORE_ERRORS = (OutputStoreError, ControlStoreError, BackendError)
EXIT_SUCCEEDED, EXIT_FAILED, EXIT_CANCELLED = 0, 1, 3
JobStates = Callable[[Sequence[str]], dict[str, str]]


class Clock:
    """A follow's time and its waits between rounds (tests inject both).  The default
    ``sleep`` waits on ``wake``, which only a push sets (``Sources.listen``): the wait ends
    at once; otherwise it is a sleep that Ctrl-C interrupts, with no bare time.sleep."""

    def __init__(self, monotonic: Callable[[], float] = time.monotonic,
                 sleep: Union[Callable[[float], object], None] = None) -> None:
        self.monotonic = monotonic
        self.wake = threading.Event()
        self.sleep: Callable[[float], object] = sleep or self._wait

    def _wait(self, seconds: float) -> None:
        # Cleared after the wait: a push's flags are set before ``wake`` and looked at
        # after this returns (``run``), so none is missed.
        self.wake.wait(seconds)
        self.wake.clear()


@dataclass
class Sources:
    """Where a task's output and results are read from (one jobq-ctl invocation)."""

    queue: str
    output: Union[OutputStore, None]
    control: Union[ControlStore, None]
    jobs: Union[JobStates, None] = None  # SQLite: id -> status of the ids in the queue
    clock: Clock = field(default_factory=Clock)
    wall: Callable[[], float] = time.time  # the cancels' clock
    pushes: Union[Watchable, None] = None  # PostgreSQL's output store: writes are pushed

    def listen(self, task_ids: Sequence[str]) -> Union[TaskWatch, None]:
        """Pushed writes to these tasks' output and results end ``clock``'s sleep at once
        (``run``); None: polled only."""
        if self.pushes is None:
            return None
        return self.pushes.watch(self.queue, task_ids, self.clock.wake.set)

    def pending_cancel(self, task_id: str,
                       records: Sequence[ResultRecord]) -> Union[ResultRecord, None]:
        """The derived end of a task cancelled before an attempt ran (ops/task_ends.py), or
        None; ``records``: the task's, just read."""
        if self.control is None:
            return None
        return read_pending_cancel(self.control, self.queue, task_id, records,
                                   lambda: self.job_state(task_id), self.wall())

    def results(self, task_id: str) -> list[ResultRecord]:
        return self.control.results_of(self.queue, task_id) if self.control else []

    def attempts(self, task_id: str,
                 records: Union[list[ResultRecord], None] = None) -> list[int]:
        """Every attempt with output or a result record (``records``: the task's, when
        just read), ascending."""
        found = set(self.output.attempts(self.queue, task_id)) if self.output else set()
        records = self.results(task_id) if records is None else records
        return sorted(found | {r.attempt for r in records})

    def job_state(self, task_id: str) -> Union[str, None]:
        """The job row's status (SQLite), "?" when the backend cannot tell, None: no such
        task."""
        if self.jobs is None:
            return "?"
        return self.jobs([task_id]).get(task_id)

    def close(self) -> None:
        for thing in (self.output, self.control, self.pushes):
            if thing is not None:
                thing.close()


def signal_name(number: int) -> str:
    try:
        return signals.Signals(number).name
    except ValueError:
        return str(number)


def exit_status(rec: Union[ResultRecord, None], job: str = "") -> int:
    """The exit status of a follow or wait that ended with ``rec`` (None: the SQLite status
    ``job`` ended it): EXIT_SUCCEEDED, EXIT_CANCELLED or EXIT_FAILED."""
    outcome = rec.outcome if rec is not None else job
    if outcome == "succeeded":
        return EXIT_SUCCEEDED
    return EXIT_CANCELLED if outcome == "cancelled" else EXIT_FAILED


def end_line(rec: ResultRecord) -> str:
    """How an attempt ended, as ``logs -f`` prints it on stderr.  A cancel: ``cancelled by
    WHO at WHEN: WHY ...`` (the reason every writer words with ``cancel_reason``)."""
    if rec.outcome == "cancelled":
        if rec.reason.startswith("cancelled by"):
            return rec.reason
        by = f"cancelled by {rec.cancelled_by or 'unknown'}"
        return f"{by}: {rec.reason}" if rec.reason else by
    if rec.outcome in ("lock-lost", "requeued"):
        return rec.outcome.replace("-", " ")
    if rec.signal is not None:
        return f"killed by signal {signal_name(rec.signal)}"
    if rec.exit_status is not None:
        return f"exit status {rec.exit_status}"
    return f"{rec.outcome}: {rec.reason}" if rec.reason else rec.outcome


class Sink:
    """A task's output to a binary stream: raw, or line by line behind ``prefix``."""

    LINE_MAX = 64 << 10  # a partial line longer than this is written as it is

    def __init__(self, out: IO[bytes], prefix: bytes = b"") -> None:
        self.out = out
        self.prefix = prefix
        self._partial = b""

    def write(self, data: bytes) -> None:
        if not self.prefix:
            self.out.write(data)
        else:
            lines = (self._partial + data).split(b"\n")
            self._partial = lines.pop()
            for line in lines:
                self.out.write(self.prefix + line + b"\n")
            if len(self._partial) > self.LINE_MAX:
                self.end()
        self.out.flush()

    def end(self) -> None:
        """The attempt's output is over: a prefixed partial line is written whole."""
        if self._partial:
            self.out.write(self.prefix + self._partial + b"\n")
            self.out.flush()
            self._partial = b""


class Follower:
    """Follows one task until an attempt ends for good (or, ``chain=False``, until the
    attempt it follows ends).  ``step`` does at most a few store calls and never sleeps; the
    caller (``run``) paces the rounds.  ``sink=None``: results only (``push --wait``)."""

    def __init__(self, src: Sources, task_id: str, sink: Union[Sink, None],
                 say: Callable[[str], None], attempt: Union[int, None] = None,
                 offset: int = 0, chain: bool = True,
                 check_every: float = CHECK_EVERY) -> None:
        self.src, self.task_id, self.sink, self.say = src, task_id, sink, say
        self.attempt, self.offset, self.chain = attempt, offset, chain
        self.phase = "results" if sink is None else ("start" if attempt is None else "read")
        self.done = False
        self.final: Union[ResultRecord, None] = None
        self.job = ""  # the SQLite status that ended the wait, when no record did
        self._since = src.clock.monotonic()
        self._next_check = 0.0
        self._ended_at: Union[float, None] = None  # a record says the attempt is over
        self._terminal_at: Union[float, None] = None  # the job row said succeeded/failed
        self._left: Union[ResultRecord, None] = None  # the record we went on to "next" on
        self.check_every = check_every

    def _enter(self, phase: str, now: float) -> None:
        self.phase, self._since, self._next_check, self._ended_at = phase, now, 0.0, None

    def _due(self, now: float) -> bool:
        if now < self._next_check:
            return False
        self._next_check = now + self.check_every
        return True

    def poke(self) -> None:
        """A write to the task was pushed: look at its records in the next ``step``."""
        self._next_check = 0.0

    def _finish(self, rec: Union[ResultRecord, None], job: str = "") -> None:
        self.done, self.final, self.job = True, rec, job

    def _job_ended(self, now: float) -> Union[str, None]:
        """The job row's terminal status once it has been so for RESULT_GRACE without a
        final record (SQLite; never on Azure, whose ``job_state`` is "?")."""
        state = self.src.job_state(self.task_id)
        if state not in ("succeeded", "failed", None):
            self._terminal_at = None
            return None
        if self._terminal_at is None:
            self._terminal_at = now
        if now - self._terminal_at < RESULT_GRACE:
            return None
        return state or "gone from the queue"

    def step(self) -> bool:
        """One round; True when output came (read again soon)."""
        now = self.src.clock.monotonic()
        if self.phase == "read":
            return self._read(now)
        if not self._due(now):
            return False
        if self.phase == "results":
            records = self.src.results(self.task_id)
            finals = [r for r in records if r.final]
            if finals:
                self._finish(finals[-1])
            elif (cancel := self.src.pending_cancel(self.task_id, records)) is not None:
                self._finish(cancel)
            elif (job := self._job_ended(now)) is not None:
                self._finish(None, job)
        elif self.phase == "result":
            self._await_result(now, look=True)
        else:  # "start", "next": wait for an attempt after self.attempt (or this one again)
            records = self.src.results(self.task_id)
            newer = [a for a in self.src.attempts(self.task_id, records)
                     if a > (self.attempt or 0)]
            if newer and not self.chain:  # a later attempt: this one will not run again
                self._finish(self._left)
            elif newer:
                if self.phase == "next":
                    self.say(f"== attempt {newer[0]} ==")
                self.attempt, self.offset, self._left = newer[0], 0, None
                self._enter("read", now)
                return self._read(now)
            elif self.phase == "next" and self._runs_again(records):
                self._enter("read", now)
                return self._read(now)
            elif (cancel := self.src.pending_cancel(self.task_id, records)) is not None:
                self.say(end_line(cancel))
                self._finish(cancel)
            elif (job := self._job_ended(now)) is not None:
                self._finish(None, job)
        return False

    def _runs_again(self, records: list[ResultRecord]) -> bool:
        """("next") Whether the attempt left moves again: its record shows another start or,
        from running, an end; or, after a requeue or without a record, its output grows (one
        read: only then, since only an uncounted release reuses the attempt's number)."""
        left = self._left
        rec = next((r for r in records if r.attempt == self.attempt), None)
        restarted = rec is not None and left is not None and rec.started != left.started
        moved = restarted or (rec is not None and left is not None and left.outcome == "running"
                              and rec.outcome != "running")
        if not moved and self.src.output is not None and (
                left is None or left.outcome in ("requeued", "running")):
            moved = self._grows()
        if moved and left is not None and left.outcome != "running":
            self.say(f"== attempt {self.attempt} runs again ==")
        return moved

    def _grows(self) -> bool:
        """Bytes past ``offset`` in the attempt's output (one read; the next ``_read`` reads
        them again)."""
        assert self.src.output is not None and self.attempt is not None
        key = AttemptKey(self.src.queue, self.task_id, self.attempt)
        return bool(self.src.output.read(key, self.offset).data)

    def _record(self) -> tuple[Union[ResultRecord, None], bool]:
        """This attempt's result record, and whether a newer attempt exists."""
        records = self.src.results(self.task_id)
        mine = [r for r in records if r.attempt == self.attempt]
        newer = any(a > (self.attempt or 0) for a in self.src.attempts(self.task_id, records))
        return (mine[0] if mine else None), newer

    def _read(self, now: float) -> bool:
        assert self.sink is not None and self.attempt is not None
        key = AttemptKey(self.src.queue, self.task_id, self.attempt)
        chunk = (self.src.output.read(key, self.offset) if self.src.output
                 else None)
        got = bool(chunk and chunk.data)
        if chunk and chunk.data:
            self.sink.write(chunk.data)
            self.offset = chunk.offset
            self._ended_at = None
        if chunk is None or chunk.complete:
            self.sink.end()
            self._enter("result", now)
            self._await_result(now)
        elif not got and self._due(now):
            rec, newer = self._record()
            if newer or (rec is not None and rec.outcome != "running"):
                self._ended_at = self._ended_at if self._ended_at is not None else now
            if self._ended_at is not None and now - self._ended_at >= ENDED_GRACE:
                self.sink.end()  # its worker ended it without completing the output
                self._enter("result", now)
                self._await_result(now)
        return got

    def _await_result(self, now: float, look: bool = False) -> None:
        """``look``: not right after a read -- new bytes while the record says running (or
        is not there) mean the attempt runs again (a requeue's end record may be missed
        between two looks): read on."""
        rec, newer = self._record()
        if rec is not None and rec.outcome != "running":
            self.say(end_line(rec))
            # Requeued: the same attempt number runs again, so even a follower of one attempt
            # waits for it.
            if rec.final or (not self.chain and rec.outcome != "requeued"):
                self._finish(rec)
            else:
                self._left = rec
                self._enter("next", now)
        elif newer and self.chain:
            self.say(f"attempt {self.attempt} ended (no result recorded)")
            self._left = rec
            self._enter("next", now)
        elif look and self.src.output is not None and self._grows():
            self._enter("read", now)
        elif now - self._since >= RESULT_GRACE:
            state = self.src.job_state(self.task_id)
            # A follower of one attempt whose record says running waits on: it may run
            # again silently (requeued), and "next" ends the wait at a newer attempt.
            if (not self.chain and rec is None) or state not in ("pending", "running"):
                self.say(f"attempt {self.attempt} ended; its result is not recorded")
                self._finish(None, state if state in ("succeeded", "failed") else "")
            else:
                self._left = rec
                self._enter("next", now)


def run(followers: Sequence[Follower], clock: Clock, warn: Callable[[str], None],
        pushed: Union[TaskWatch, None] = None) -> None:
    """Step every follower until all are done (main thread).  A store that fails after it
    was reached is retried for FAIL_FOR seconds (one warning), then the error is raised; one
    that fails the first round raises at once.  ``pushed`` (``Sources.listen``): a follower
    whose task was written to looks at once, and a push ends the sleep between rounds; the
    polling stays the backstop."""
    interval = POLL_MIN
    failing_since: Union[float, None] = None
    reached = False  # a store that fails the first round is reported at once
    while True:
        live = [f for f in followers if not f.done]
        if not live:
            return
        if pushed is not None:
            for f in live:
                if pushed.changed(f.task_id):
                    f.poke()
        more = False
        try:
            for f in live:
                more = f.step() or more
            failing_since, reached = None, True
        except STORE_ERRORS as exc:
            if not reached:
                raise
            now = clock.monotonic()
            if failing_since is None:
                failing_since = now
                warn(f"{exc}; retrying for {FAIL_FOR:g}s")
            elif now - failing_since > FAIL_FOR:
                raise
        if all(f.done for f in live):
            # No sleep after the last end: that sleep was ``push --wait``'s whole lag after
            # its result line (up to POLL_MAX; issue 41 §4)
            return
        interval = POLL_MIN if more else min(POLL_MAX, interval * 1.5)
        clock.sleep(interval)
