"""``jobq-ctl logs`` and ``push --wait/--follow`` (main thread of jobq-ctl): the commands on
top of the follower of ops/follow.py (the stores they read: sources.open_sources; the last
lines of an attempt: ops/output.py).

Streams: stdout carries a task's output as it was printed (raw bytes; with several tasks
followed, each line behind ``<id>: ``) and, for push, the ids first; stderr carries
everything else (attempt headers, how an attempt ended, the result lines of ``--wait``), so
``jobq-ctl logs ID > out.log`` and ``ids=$(jobq-ctl push ... --wait)`` keep only data.
Exit statuses: 0 (``logs`` without ``-f``: the output was shown); ``logs -f`` and ``push
--wait/--follow`` exit by how the task ended (follow.exit_status: 0 succeeded, 1 failed,
3 cancelled); 1 also for an unknown id or attempt and a store that cannot be reached; 2 (no
store configured), 130 (Ctrl-C).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import IO, Union

from ..core.options import UsageError
from ..fleet.control.records import ResultRecord
from ..fleet.output.base import AttemptKey
from ..ops.follow import (
    CHECK_EVERY,
    EXIT_CANCELLED,
    EXIT_FAILED,
    Clock,
    Follower,
    Sink,
    Sources,
    end_line,
    exit_status,
    run,
)
from ..ops.output import tail
from .stdout import flush_or_drop, quiet_stdout

EXIT_INTERRUPTED = 130


# ----------------------------------------------------------------------------------- logs
def dump(src: Sources, key: AttemptKey, sink: Sink) -> int:
    """Write what the attempt's output holds now; the offset after it."""
    assert src.output is not None
    offset = 0
    while True:
        chunk = src.output.read(key, offset)
        if chunk.data:
            sink.write(chunk.data)
        offset = chunk.offset
        if chunk.complete or not chunk.data:
            return offset


Say = Callable[[str], None]


def _warner(say: Say) -> Say:
    return lambda text: say(f"jobq-ctl: warning: {text}")


def logs(ns: argparse.Namespace, src: Sources, out: IO[bytes], err: IO[str]) -> int:
    """``jobq-ctl logs``: 0, or 1 for an unknown id or attempt; with ``-f``, how the task
    (or the one attempt followed) ended (``exit_status``)."""
    def say(text: str) -> None:
        print(text, file=err, flush=True)

    task_id = ns.id
    found = src.attempts(task_id)
    if not found and not ns.attempt:
        state = src.job_state(task_id)
        cancel = src.pending_cancel(task_id, []) if state is not None else None
        if state is None or (state == "?" and not ns.follow and cancel is None):
            what = (f"no task {task_id!r} in queue {src.queue}" if src.jobs is not None
                    else f"no output or result for {task_id!r} in queue {src.queue}")
            say(f"jobq-ctl: error: logs: {what}")
            return 1
        if not ns.follow:
            what = ("yet" if state in ("pending", "running", "?") and cancel is None
                    else "stored")
            say(f"jobq-ctl: task {task_id} has no output {what} "
                f"({end_line(cancel) if cancel else state})")
            return 0
        if cancel is not None:
            say(end_line(cancel))
            return EXIT_CANCELLED
        say(f"waiting for task {task_id} to start...")
        f = Follower(src, task_id, Sink(out), say)
        run([f], src.clock, _warner(say), src.listen([task_id]))
        return exit_status(f.final, f.job)
    ended = any(r.final for r in src.results(task_id))  # no attempt comes after
    if ns.attempt and ns.attempt not in found and (ended or not ns.follow):
        say(f"jobq-ctl: error: logs: task {task_id} has no attempt {ns.attempt} (attempts: "
            f"{', '.join(map(str, found)) or 'none'})")
        return 1
    chosen = [ns.attempt] if ns.attempt else (found if ns.all else found[-1:])
    assert src.output is not None
    stored = set(src.output.attempts(src.queue, task_id))
    sink = Sink(out)
    offset = 0
    for i, attempt in enumerate(chosen):
        following = ns.follow and i == len(chosen) - 1
        if ns.all:
            say(f"== attempt {attempt} ==")
        if attempt not in stored and not following:
            say(f"(attempt {attempt}: no output stored)")
            continue
        key = AttemptKey(src.queue, task_id, attempt)
        if ns.tail is not None:
            data, offset = tail(src.output, key, ns.tail)
            sink.write(data)
        elif not following:
            dump(src, key, sink)
    if ns.follow:
        f = Follower(src, task_id, sink, say, attempt=chosen[-1], offset=offset,
                     chain=not ns.attempt)
        run([f], src.clock, _warner(say), src.listen([task_id]))
        return exit_status(f.final, f.job)
    return 0


def cmd_logs(ns: argparse.Namespace, src: Sources) -> int:
    if ns.tail is not None and ns.tail < 0:
        raise UsageError("--tail: must be 0 or more")
    if ns.attempt is not None and ns.attempt < 1:
        raise UsageError("--attempt: must be 1 or more")
    try:
        return logs(ns, src, sys.stdout.buffer, sys.stderr)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        quiet_stdout()
        return 0


# ------------------------------------------------------------------------- push --wait
def result_line(task_id: str, rec: Union[ResultRecord, None], job: str = "") -> str:
    """One line per task for ``push --wait``; ``job``: the SQLite status when no record."""
    if rec is None:
        return f"{task_id} {job or 'ended'} (no result record)"
    if rec.outcome == "succeeded":
        return f"{task_id} succeeded"
    if rec.outcome == "cancelled":
        return f"{task_id} {end_line(rec)}"
    return f"{task_id} failed: {end_line(rec)}"


def wait_pushed(ids: Sequence[str], src: Sources, follow: bool, out: IO[bytes],
                err: IO[str]) -> int:
    """Wait until every pushed task ended for good, printing a result line for each as it
    does: 0 when all succeeded, 1 when one failed, else 3 when one was cancelled
    (``exit_status``); 130 on Ctrl-C (the tasks go on)."""
    several = len(ids) > 1

    def sayer(task_id: str) -> Say:
        prefix = f"{task_id}: " if several else ""
        return lambda text: print(prefix + text, file=err, flush=True)

    # results of many tasks are read less often: 20 record reads a second at most
    every = min(10.0, max(CHECK_EVERY, len(ids) / 20))
    followers = [Follower(src, i, Sink(out, f"{i}: ".encode() if several else b"")
                          if follow else None, sayer(i), check_every=every)
                 for i in dict.fromkeys(ids)]
    reported: set[str] = set()

    def report() -> None:
        for f in followers:
            if f.done and f.task_id not in reported:
                reported.add(f.task_id)
                print(result_line(f.task_id, f.final, f.job), file=err, flush=True)

    def sleep(seconds: float) -> object:
        report()
        return src.clock.sleep(seconds)

    try:
        run(followers, Clock(src.clock.monotonic, sleep), _warner(sayer("")),
            src.listen([f.task_id for f in followers]))
        report()
    except KeyboardInterrupt:
        return _stopped([f.task_id for f in followers if not f.done], err)
    codes = {exit_status(f.final, f.job) for f in followers}
    return EXIT_FAILED if EXIT_FAILED in codes else max(codes)


def _stopped(left: Sequence[str], err: IO[str]) -> int:
    print(f"stopped waiting; the tasks go on: {' '.join(left)}", file=err, flush=True)
    return EXIT_INTERRUPTED


def after_push(ids: Sequence[str], ns: argparse.Namespace, src: Sources,
               announce: Callable[[], None]) -> int:
    """push_command hands over here once the tasks are pushed; ``announce`` prints their ids
    (flushed: scripts read them while the wait goes on).  Called inside the Ctrl-C answer: an
    id may be out the moment it is printed (PYTHONUNBUFFERED), and from then on a Ctrl-C must
    say that the tasks go on -- printed after it, that line was lost now and then."""
    try:
        announce()
        flush_or_drop()
        return wait_pushed(ids, src, ns.follow, sys.stdout.buffer, sys.stderr)
    except KeyboardInterrupt:
        return _stopped(ids, sys.stderr)
    except BrokenPipeError:  # the reader of --follow's output went away: the wait ends
        quiet_stdout()
        return 1
