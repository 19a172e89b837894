"""``jobq-ctl logs`` and ``push --wait/--follow`` (main thread of jobq-ctl): which stores they
read (``open_sources``), the last lines of an attempt (``tail``), and the commands on top of
the follower of ctl_follow.py.

Streams: stdout carries a task's output as it was printed (raw bytes; with several tasks
followed, each line behind ``<id>: ``) and, for push, the ids first; stderr carries
everything else (attempt headers, how an attempt ended, the result lines of ``--wait``), so
``jobq-ctl logs ID > out.log`` and ``ids=$(jobq-ctl push ... --wait)`` keep only data.
Exit statuses: 0 (``logs`` without ``-f``: the output was shown); ``logs -f`` and ``push
--wait/--follow`` exit by how the task ended (ctl_follow.exit_status: 0 succeeded, 1 failed,
3 cancelled); 1 also for an unknown id or attempt and a store that cannot be reached; 2 (no
store configured), 130 (Ctrl-C).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import IO, Any, Union

from ..core.options import UsageError
from ..fleet.control.records import ResultRecord
from ..fleet.output.base import AttemptKey, OutputStore
from ..fleet.output.open import open_output_store
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
from .stdout import flush_or_drop, quiet_stdout

EXIT_INTERRUPTED = 130
PROBE = 1 << 20  # tail: the end of an attempt is found to within this many bytes ...
TAIL_STEP = 256 << 10  # ... then read backwards in steps of this size ...
TAIL_MAX = 16 << 20  # ... for at most this much (the last lines of a huge one-line output)
# s per blob call: with start-up, an unreachable (black-holed) store is exit 1 within 10 s
READ_TIMEOUT = 5.0


# --------------------------------------------------------------------------------- stores
def open_sources(ns: Any, settings: Any, backend: Any) -> Sources:
    """The stores ``logs`` or ``push --wait/--follow`` read; before a push, so that a
    configuration that cannot work is exit 2 with nothing pushed.  ``push --wait`` on SQLite
    works without a control store (``--control off``): the job rows' status ends the wait."""
    from .fleet_commands import open_store

    name = "logs" if ns.command == "logs" else "push --follow" if ns.follow else "push --wait"
    jobs = None
    if backend is not None and backend.name == "sqlite":
        from ..backends.sqlite.admin import task_states

        jobs = lambda ids: task_states(backend, ids)  # noqa: E731
    needs_output = ns.command == "logs" or ns.follow
    if settings.control == "off" and jobs is not None and not needs_output:
        return Sources(settings.queue, None, None, jobs)
    control = open_store(name, settings)  # None is a UsageError: which option to set
    assert control is not None
    try:
        output = (open_output_store(settings, create=False, read_timeout=READ_TIMEOUT)
                  if needs_output else None)
    except BaseException:
        control.close()
        raise
    if needs_output and output is None:
        control.close()
        raise UsageError(f"{name}: no output store: task output is kept beside the control "
                         "store (SQLite: files beside the database; Azure: blob container "
                         "--task-log-container in the account of --control-account-url or "
                         "--control-connection-string)")
    return Sources(settings.queue, output, control, jobs)


# ----------------------------------------------------------------------------------- tail
def output_end(store: OutputStore, key: AttemptKey) -> int:
    """The size of the attempt's output, found by one-byte reads (about 2*log2(size/PROBE))
    rather than by downloading it."""
    lo, hi = 0, PROBE  # data ends at or after lo, before hi (once a probe at hi-1 failed)
    while store.read(key, hi - 1, 1).data:
        lo, hi = hi, hi * 2
    while hi - lo > PROBE:
        mid = (lo + hi) // 2
        if store.read(key, mid - 1, 1).data:
            lo = mid
        else:
            hi = mid
    while True:
        chunk = store.read(key, lo)
        if not chunk.data:
            return lo
        lo = chunk.offset


def _read_range(store: OutputStore, key: AttemptKey, start: int, end: int) -> bytes:
    parts = []
    while start < end:
        chunk = store.read(key, start, end - start)
        if not chunk.data:
            break
        parts.append(chunk.data)
        start = chunk.offset
    return b"".join(parts)


def tail(store: OutputStore, key: AttemptKey, n: int) -> tuple[bytes, int]:
    """The last ``n`` lines of the attempt's output (at most TAIL_MAX bytes of them) and the
    offset after them, reading backwards from the end."""
    end = output_end(store, key)
    start, buf = end, b""
    while start > 0 and len(buf) < TAIL_MAX:
        body = buf[:-1] if buf.endswith(b"\n") else buf
        if body.count(b"\n") >= n:  # the first of the last n lines starts after a newline
            break
        new_start = max(0, start - TAIL_STEP)
        buf = _read_range(store, key, new_start, start) + buf
        start = new_start
    lines = buf.splitlines(keepends=True)
    return (b"".join(lines[-n:]) if n > 0 else b""), end


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


def _warner(say: Any) -> Any:
    return lambda text: say(f"jobq-ctl: warning: {text}")


def logs(ns: Any, src: Sources, out: IO[bytes], err: IO[str]) -> int:
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
        run([f], src.clock, _warner(say))
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
        run([f], src.clock, _warner(say))
        return exit_status(f.final, f.job)
    return 0


def cmd_logs(ns: Any, src: Sources) -> int:
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

    def sayer(task_id: str) -> Any:
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
        run(followers, Clock(src.clock.monotonic, sleep), _warner(sayer("")))
        report()
    except KeyboardInterrupt:
        return _stopped([f.task_id for f in followers if not f.done], err)
    codes = {exit_status(f.final, f.job) for f in followers}
    return EXIT_FAILED if EXIT_FAILED in codes else max(codes)


def _stopped(left: Sequence[str], err: IO[str]) -> int:
    print(f"stopped waiting; the tasks go on: {' '.join(left)}", file=err, flush=True)
    return EXIT_INTERRUPTED


def after_push(ids: Sequence[str], ns: Any, src: Sources) -> int:
    """ctl.cmd_push hands over here once the ids are printed (and flushed: scripts read
    them while the wait goes on)."""
    try:
        flush_or_drop()  # inside: once a script sees the ids, Ctrl-C is answered here
        return wait_pushed(ids, src, ns.follow, sys.stdout.buffer, sys.stderr)
    except KeyboardInterrupt:
        return _stopped(ids, sys.stderr)
    except BrokenPipeError:  # the reader of --follow's output went away: the wait ends
        quiet_stdout()
        return 1
