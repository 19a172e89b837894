"""The follower of ``jobq-ctl logs -f`` and ``push --wait/--follow`` (ctl_follow.py,
ctl_output.py) on the real stores (FileOutputStore, SqliteControlStore) and a fake clock: the
records and output a worker writes are scripted at fake times, and every poll is a step of
that clock, so nothing here sleeps."""

from __future__ import annotations

import io
from pathlib import Path
from types import SimpleNamespace

import pytest

from supervisor.ctl.output_commands import logs, result_line, wait_pushed
from supervisor.fleet.output.base import AttemptKey, Chunk, OutputStoreError
from supervisor.fleet.output.files import FileOutputStore
from supervisor.ops.follow import (
    ENDED_GRACE,
    FAIL_FOR,
    RESULT_GRACE,
    Follower,
    Sink,
    Sources,
    end_line,
    run,
)
from supervisor.ops.output import tail
from tests.fakes.clock import EventClock
from tests.fakes.follow import Q, key, ns, result


class TimedOut(io.BytesIO):
    """stdout that notes the fake time each line arrived."""

    def __init__(self, fake: EventClock) -> None:
        super().__init__()
        self.fake = fake
        self.arrived: dict[bytes, float] = {}

    def write(self, data) -> int:  # type: ignore[override]
        for line in bytes(data).splitlines():
            self.arrived.setdefault(line, self.fake.now)
        return super().write(data)


def complete_output(w: SimpleNamespace, task: str, attempt: int, data: bytes) -> None:
    """The attempt's whole output, finished, in ``w``'s output store."""
    w.out.append(key(task, attempt), data)
    w.out.finish(key(task, attempt))


def captured(command, args, w: SimpleNamespace) -> tuple[int, bytes, str]:
    """``command(args, w.src, out, err)`` with fresh streams: (its exit status, what it wrote
    to out, what it wrote to err)."""
    out, err = io.BytesIO(), io.StringIO()
    return command(args, w.src, out, err), out.getvalue(), err.getvalue()


def test_follow_shows_each_line_within_a_second_and_ends_with_the_exit_status(world):
    w = world
    w.jobs["t1"] = "running"
    w.control.put_result(result("t1", 1, "running", False))
    w.out.append(key("t1", 1), b"first\n")
    printed: dict[bytes, float] = {}
    # a line every 100 ms, then one every 2.7 s (the follower has backed off by then)
    times = [0.1 * i for i in range(20)] + [2.0 + 2.7 * i for i in range(1, 6)]
    for i, when in enumerate(times):
        line = b"line %d" % i
        printed[line] = when
        w.fake.at(when, lambda line=line: w.out.append(key("t1", 1), line + b"\n"))
    w.fake.at(16.0, lambda: (w.out.finish(key("t1", 1)),
                            w.control.put_result(result("t1", 1, "failed", True, 3))))
    out, err = TimedOut(w.fake), io.StringIO()
    assert logs(ns("t1", follow=True), w.src, out, err) == 1  # it failed
    assert out.getvalue() == b"first\n" + b"".join(line + b"\n" for line in printed)
    late = {line: out.arrived[line] - t for line, t in printed.items()}
    assert max(late.values()) <= 1.0 + 1e-9, late
    assert err.getvalue() == "exit status 3\n"


def test_follow_waits_for_a_task_not_started_then_follows_each_retry_to_the_final_one(world):
    w = world
    w.jobs["t2"] = "pending"

    def attempt(n: int, text: bytes, outcome: str, final: bool, status: int) -> None:
        w.control.put_result(result("t2", n, "running", False))
        w.out.append(key("t2", n), text)
        w.fake.at(w.fake.now + 2, lambda: (w.out.finish(key("t2", n)), w.control.put_result(
            result("t2", n, outcome, final, status))))

    w.fake.at(5.0, lambda: attempt(1, b"one\n", "failed", False, 1))
    w.fake.at(20.0, lambda: attempt(2, b"two\n", "succeeded", True, 0))
    rc, out, err = captured(logs, ns("t2", follow=True), w)
    assert rc == 0
    assert out == b"one\ntwo\n"
    assert err.splitlines() == ["waiting for task t2 to start...", "exit status 1",
                                "== attempt 2 ==", "exit status 0"]


def test_complete_output_waits_for_its_result_record_a_bounded_time(world):
    w = world
    w.jobs["t3"] = "running"
    complete_output(w, "t3", 1, b"x\n")
    w.fake.at(4.0, lambda: w.control.put_result(result("t3", 1, "failed", True, signal=9)))
    err = io.StringIO()
    assert logs(ns("t3", follow=True), w.src, io.BytesIO(), err) == 1
    assert err.getvalue() == "killed by signal SIGKILL\n"
    assert 4.0 <= w.fake.now < 6.0

    complete_output(w, "t4", 1, b"y\n")
    w.jobs["t4"] = "succeeded"
    start, err = w.fake.now, io.StringIO()
    assert logs(ns("t4", follow=True), w.src, io.BytesIO(), err) == 0
    assert err.getvalue() == "attempt 1 ended; its result is not recorded\n"
    assert RESULT_GRACE <= w.fake.now - start < RESULT_GRACE + 3


def test_an_attempt_whose_worker_died_ends_on_its_record_and_the_next_one_is_followed(world):
    w = world
    w.jobs["t5"] = "running"
    w.out.append(key("t5", 1), b"half a li")  # never finished: the worker died
    w.fake.at(3.0, lambda: w.control.put_result(result("t5", 1, "lock-lost", False)))
    w.fake.at(30.0, lambda: (w.out.append(key("t5", 2), b"again\n"), w.out.finish(key("t5", 2)),
                             w.control.put_result(result("t5", 2, "cancelled", True,
                                                         cancelled_by="ann@box",
                                                         reason="wrong input"))))
    rc, out, err = captured(logs, ns("t5", follow=True), w)
    assert rc == 3  # cancelled
    assert out == b"half a liagain\n"
    assert err.splitlines() == ["lock lost", "== attempt 2 ==",
                                "cancelled by ann@box: wrong input"]


def test_ended_attempt_is_not_cut_while_its_output_still_flows(world):
    """The record may come before the worker's last flush: ENDED_GRACE of silence first."""
    w = world
    w.jobs["t6"] = "running"
    w.out.append(key("t6", 1), b"a\n")
    w.control.put_result(result("t6", 1, "succeeded", True, 0))
    w.fake.at(ENDED_GRACE - 1, lambda: w.out.append(key("t6", 1), b"b\n"))
    rc, out, err = captured(logs, ns("t6", follow=True), w)
    assert rc == 0
    assert out == b"a\nb\n" and err == "exit status 0\n"


def test_logs_without_follow_latest_all_attempt_and_unknown(world):
    w = world
    w.jobs.update({"t7": "succeeded", "t8": "pending"})
    complete_output(w, "t7", 1, b"one\n")
    w.control.put_result(result("t7", 2, "succeeded", True, 0))  # output kept locally
    w.out.append(key("t7", 3), b"three\n")
    out, err = io.BytesIO(), io.StringIO()
    assert logs(ns("t7"), w.src, out, err) == 0 and out.getvalue() == b"three\n"
    out, err = io.BytesIO(), io.StringIO()
    assert logs(ns("t7", all=True), w.src, out, err) == 0
    assert out.getvalue() == b"one\nthree\n"
    assert err.getvalue().splitlines() == ["== attempt 1 ==", "== attempt 2 ==",
                                           "(attempt 2: no output stored)", "== attempt 3 =="]
    out, err = io.BytesIO(), io.StringIO()
    assert logs(ns("t7", attempt=1), w.src, out, err) == 0 and out.getvalue() == b"one\n"
    err = io.StringIO()
    assert logs(ns("t7", attempt=9), w.src, io.BytesIO(), err) == 1
    assert err.getvalue() == "jobq-ctl: error: logs: task t7 has no attempt 9 (attempts: " \
                             "1, 2, 3)\n"
    err = io.StringIO()  # -f of an attempt that cannot come any more
    assert logs(ns("t7", attempt=9, follow=True), w.src, io.BytesIO(), err) == 1
    assert "has no attempt 9" in err.getvalue()
    err = io.StringIO()
    assert logs(ns("nope"), w.src, io.BytesIO(), err) == 1
    assert err.getvalue() == "jobq-ctl: error: logs: no task 'nope' in queue jobs\n"
    err = io.StringIO()
    assert logs(ns("t8"), w.src, io.BytesIO(), err) == 0
    assert err.getvalue() == "jobq-ctl: task t8 has no output yet (pending)\n"
    azure = Sources(Q, w.out, w.control, None, w.fake.clock())  # cannot list its ids
    err = io.StringIO()
    assert logs(ns("nope"), azure, io.BytesIO(), err) == 1
    assert err.getvalue() == "jobq-ctl: error: logs: no output or result for 'nope' in " \
                             "queue jobs\n"


class Counting(FileOutputStore):
    def __init__(self, root: str) -> None:
        super().__init__(root)
        self.bytes_read = 0

    def read(self, key: AttemptKey, offset: int = 0, limit: int = 4 << 20) -> Chunk:
        chunk = super().read(key, offset, limit)
        self.bytes_read += len(chunk.data)
        return chunk


def test_tail_reads_the_end_not_the_whole_output(tmp_path: Path):
    store = Counting(str(tmp_path / "out"))
    k = key("big", 1)
    body = b"".join(b"line %07d\n" % i for i in range(2_000_000))  # 26 MB
    store.append(k, body)
    data, end = tail(store, k, 3)
    assert data == b"line 1999997\nline 1999998\nline 1999999\n" and end == len(body)
    assert store.bytes_read < 3 << 20, store.bytes_read
    store.append(k, b"no newline at the end")
    assert tail(store, k, 2)[0] == b"line 1999999\nno newline at the end"
    assert tail(store, k, 0) == (b"", len(body) + 21)

    small = key("small", 1)
    store.append(small, b"a\nb\n")
    assert tail(store, small, 10) == (b"a\nb\n", 4)
    assert tail(store, key("none", 1), 5) == (b"", 0)
    long_lines = key("long", 1)
    store.append(long_lines, b"x" * (700 << 10) + b"\n" + b"y" * (600 << 10) + b"\n")
    assert tail(store, long_lines, 1)[0] == b"y" * (600 << 10) + b"\n"


def test_end_lines_and_result_lines():
    assert end_line(result("a", 1, "requeued", False)) == "requeued"
    assert end_line(result("a", 1, "failed", False, signal=15)) == "killed by signal SIGTERM"
    assert end_line(result("a", 1, "cancelled", True, cancelled_by="x@y")) == "cancelled by x@y"
    assert result_line("a", result("a", 2, "succeeded", True, 0)) == "a succeeded"
    assert result_line("a", result("a", 2, "failed", True, 3)) == "a failed: exit status 3"
    assert result_line("a", result("a", 1, "cancelled", True, cancelled_by="x@y")) \
        == "a cancelled by x@y"
    assert result_line("a", None, "failed") == "a failed (no result record)"


def test_prefixed_sink_writes_whole_lines_behind_the_id():
    out = io.BytesIO()
    sink = Sink(out, b"t1: ")
    sink.write(b"one\ntw")
    sink.write(b"o\nthr")
    assert out.getvalue() == b"t1: one\nt1: two\n"
    sink.end()
    assert out.getvalue() == b"t1: one\nt1: two\nt1: thr\n"


def test_push_wait_reports_each_task_and_exits_1_when_one_did_not_succeed(world):
    w = world
    w.jobs.update({"ok": "pending", "bad": "pending"})
    w.fake.at(3.0, lambda: w.control.put_result(result("ok", 1, "succeeded", True, 0)))
    w.fake.at(4.0, lambda: w.control.put_result(result("bad", 1, "failed", False, 2)))
    w.fake.at(9.0, lambda: w.control.put_result(result("bad", 2, "failed", True, 3)))
    err = io.StringIO()
    assert wait_pushed(["ok", "bad"], w.src, False, io.BytesIO(), err) == 1
    assert err.getvalue().splitlines() == ["ok succeeded", "bad failed: exit status 3"]

    w.jobs["ok2"] = "pending"
    w.fake.at(w.fake.now + 2, lambda: w.control.put_result(result("ok2", 1, "succeeded", True,
                                                                  0)))
    assert wait_pushed(["ok2"], w.src, False, io.BytesIO(), io.StringIO()) == 0


def test_push_follow_prefixes_lines_of_several_tasks(world):
    w = world
    for task, status in (("ta", 0), ("tb", 1)):
        w.jobs[task] = "running"
        complete_output(w, task, 1, b"hello from " + task.encode() + b"\n")
        w.control.put_result(result(task, 1, "succeeded" if status == 0 else "failed", True,
                                    status))
    out, err = io.BytesIO(), io.StringIO()
    assert wait_pushed(["ta", "tb"], w.src, True, out, err) == 1
    assert out.getvalue() == b"ta: hello from ta\ntb: hello from tb\n"
    assert err.getvalue().splitlines() == ["ta: exit status 0", "tb: exit status 1",
                                           "ta succeeded", "tb failed: exit status 1"]


def test_sqlite_job_row_ends_a_wait_without_a_final_record(world):
    """A task whose row says failed and that gets no result record (``--control off``, or a
    record lost): the row ends the wait."""
    w = world
    w.jobs["c1"] = "pending"
    w.fake.at(2.0, lambda: w.jobs.update(c1="failed"))
    err = io.StringIO()
    assert wait_pushed(["c1"], w.src, False, io.BytesIO(), err) == 1
    assert err.getvalue() == "c1 failed (no result record)\n"
    assert 2.0 + RESULT_GRACE <= w.fake.now < 2.0 + RESULT_GRACE + 3


def test_a_failing_store_is_retried_with_one_warning_then_the_error_is_raised(world):
    w = world

    class Flaky:
        done = False
        calls = 0

        def step(self) -> bool:
            self.calls += 1
            if self.calls == 1:
                return False
            raise OutputStoreError("output store x: connection refused")

    flaky = Flaky()
    warnings: list[str] = []
    with pytest.raises(OutputStoreError):
        run([flaky], w.fake.clock(), warnings.append)  # type: ignore[list-item]
    assert warnings == ["output store x: connection refused; retrying for 60s"]
    assert FAIL_FOR < w.fake.now < FAIL_FOR + 2


def test_follower_of_one_attempt_stops_at_its_end(world):
    """``logs -f --attempt 1``: not chained to the retry."""
    w = world
    w.jobs["t9"] = "pending"
    complete_output(w, "t9", 1, b"1\n")
    w.control.put_result(result("t9", 1, "failed", False, 1))
    f = Follower(w.src, "t9", Sink(io.BytesIO()), lambda s: None, attempt=1, chain=False)
    run([f], w.fake.clock(), lambda s: None)
    assert f.done and f.final is not None and f.final.attempt == 1


def test_a_store_that_fails_the_first_round_is_reported_at_once(world):
    w = world

    class Down:
        done = False

        def step(self) -> bool:
            raise OutputStoreError("output store x: connection refused")

    warnings: list[str] = []
    with pytest.raises(OutputStoreError):
        run([Down()], w.fake.clock(), warnings.append)  # type: ignore[list-item]
    assert warnings == [] and w.fake.now == 0.0


def _cancel(w: SimpleNamespace, task: str, when: float) -> None:
    from supervisor.fleet.control.records import Cancel

    w.control.put_cancel(Cancel(queue=Q, task_id=task, reason="wrong input", who="ann@box",
                                when=when))


def test_a_pending_task_cancelled_ends_a_wait_with_who_and_why_at_once(world):
    """jobq-ctl cancel took the pending row (failed) and wrote the cancel: the wait says who
    and why, and exits 3, on its next look -- not after RESULT_GRACE, not as failed."""
    w = world
    w.src.wall = lambda: 2.0e9
    w.jobs["c2"] = "pending"
    w.fake.at(2.0, lambda: (_cancel(w, "c2", 2.0e9 - 1), w.jobs.update(c2="failed")))
    err = io.StringIO()
    assert wait_pushed(["c2"], w.src, False, io.BytesIO(), err) == 3
    assert err.getvalue() == ("c2 cancelled by ann@box at 2033-05-18T03:33:19Z: wrong input "
                              "(before it started)\n")
    assert w.fake.now < 2.0 + 3


def test_logs_follow_of_a_task_cancelled_while_backing_off_ends_with_the_cancel(world):
    w = world
    w.src.wall = lambda: 2.0e9
    w.jobs["c3"] = "pending"
    complete_output(w, "c3", 1, b"try 1\n")
    w.control.put_result(result("c3", 1, "failed", False, 1))
    w.fake.at(3.0, lambda: (_cancel(w, "c3", 2.0e9 - 1), w.jobs.update(c3="failed")))
    rc, out, err = captured(logs, ns("c3", follow=True), w)
    assert (rc, out) == (3, b"try 1\n")
    assert err.splitlines() == ["exit status 1", "cancelled by ann@box at "
                                "2033-05-18T03:33:19Z: wrong input (before it started)"]
    assert w.fake.now < 3.0 + 3
    # and without -f: the same words, exit 0; a pending one never started says so too
    w.jobs["c4"] = "failed"
    _cancel(w, "c4", 2.0e9 - 1)
    rc, out, err = captured(logs, ns("c4"), w)
    assert (rc, out) == (0, b"")
    assert err == ("jobq-ctl: task c4 has no output stored (cancelled by ann@box at "
                   "2033-05-18T03:33:19Z: wrong input (before it started))\n")
    rc, out, err = captured(logs, ns("c4", follow=True), w)
    assert rc == 3 and "cancelled by ann@box" in err


def test_exit_statuses_of_a_wait_by_outcome(world):
    w = world
    w.src.wall = lambda: 2.0e9
    for task, outcome in (("s", "succeeded"), ("x", "cancelled")):
        w.jobs[task] = "pending"
        w.control.put_result(result(task, 1, outcome, True, 0, cancelled_by="ann@box"))
    assert wait_pushed(["s"], w.src, False, io.BytesIO(), io.StringIO()) == 0
    assert wait_pushed(["s", "x"], w.src, False, io.BytesIO(), io.StringIO()) == 3
    w.jobs["f"] = "pending"
    w.control.put_result(result("f", 1, "failed", True, 2))
    assert wait_pushed(["s", "x", "f"], w.src, False, io.BytesIO(), io.StringIO()) == 1
