"""Issue 16, the reading side: ``jobq-ctl logs`` and ``push --wait/--follow`` as real
processes on a real SQLite queue.  No worker runs: the test writes output and result records
through the store APIs, exactly as a worker's output-store thread and settlement do, while
jobq-ctl reads them."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from supervisor.backends.sqlite.backend import SqliteBackend
from supervisor.core.task import Task
from supervisor.fleet.control.records import ResultRecord
from supervisor.fleet.control.sqlite import SqliteControlStore
from supervisor.fleet.output.base import AttemptKey
from supervisor.fleet.output.files import FileOutputStore, output_dir
from tests.conftest import command, wait_for
from tests.integration.captured import Captured

QUEUE = "jobs"


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("JOBQ_")}


class Queue:
    def __init__(self, db: Path) -> None:
        self.db = db
        # it stands in for the worker: it serves the queue (no "no worker" warning at push)
        self.backend = SqliteBackend(str(db), QUEUE, "test-worker", serve=True)
        self.control = SqliteControlStore(str(db))
        self.out = FileOutputStore(output_dir(str(db)))

    def push(self, *cmds: str) -> list[str]:
        return self.backend.push([Task(cmd=c) for c in cmds])

    def args(self, *args: str) -> list[str]:
        return [*command("jobq-ctl"), "--sqlite-path", str(self.db), "--queue", QUEUE, *args]

    def run(self, *args: str) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run(self.args(*args), env=_env(), capture_output=True, timeout=60)

    def start(self, *args: str) -> Ctl:
        return Ctl(subprocess.Popen(self.args(*args), env=_env(), stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE))

    def result(self, task: str, attempt: int, outcome: str, final: bool = False,
               exit_status: int | None = None) -> None:
        now = time.time()
        self.control.put_result(ResultRecord(
            queue=QUEUE, task_id=task, attempt=attempt, outcome=outcome, reason="", tail="",
            exit_status=exit_status, worker="vm1:1:aa", when=now, started=now,
            finished=None if outcome == "running" else now, final=final))

    def output(self, task: str, attempt: int, data: bytes, finish: bool = False) -> None:
        key = AttemptKey(QUEUE, task, attempt)
        if data:
            self.out.append(key, data)
        if finish:
            self.out.finish(key)

    def close(self) -> None:
        self.control.close()
        self.backend.close()


Ctl = Captured


@pytest.fixture
def q(tmp_path: Path) -> Iterator[Queue]:
    queue = Queue(tmp_path / "q.db")
    started: list[Ctl] = []
    orig = queue.start

    def start(*args: str) -> Ctl:
        ctl = orig(*args)
        started.append(ctl)
        return ctl

    queue.start = start  # type: ignore[method-assign]
    yield queue
    for ctl in started:
        ctl.kill()
    queue.close()


def _following(q, cmd: str, first: bytes) -> tuple[str, Ctl]:
    """A task pushed with ``cmd``, its attempt 1 running with output ``first``, and a
    ``jobq-ctl logs -f`` of it that has printed its first line."""
    (task,) = q.push(cmd)
    q.result(task, 1, "running")
    q.output(task, 1, first)
    ctl = q.start("logs", "-f", task)
    wait_for(lambda: ctl.out, 30, what="the first line")
    return task, ctl


@pytest.mark.timing  # asserts a 3 s lag
def test_logs_follow_shows_each_line_within_3s_and_ends_with_the_exit_status(q):
    task, ctl = _following(q, "yes", b"start\n")
    written: dict[bytes, float] = {}
    for i in range(30):  # a line every 100 ms, then a pause the follower backs off in
        line = b"line %d\n" % i
        written[line] = time.time()
        q.output(task, 1, line)
        time.sleep(0.1 if i < 20 else 0.7)
    q.output(task, 1, b"", finish=True)
    q.result(task, 1, "failed", final=True, exit_status=3)
    assert ctl.wait() == 1, ctl.err  # the task failed (issue 25: exit by the outcome)
    arrived = {line: t for t, line in ctl.out}
    assert ctl.stdout() == b"start\n" + b"".join(written)
    late = max(arrived[line] - t for line, t in written.items())
    assert late < 3.0, late
    assert ctl.err == ["exit status 3"]


def test_logs_follow_waits_for_a_task_not_started_and_follows_its_retries(q):
    (task,) = q.push("flaky")
    ctl = q.start("logs", "-f", task)
    ctl.wait_err(f"waiting for task {task} to start...")
    q.result(task, 1, "running")
    q.output(task, 1, b"try one\n")
    wait_for(lambda: ctl.stdout() == b"try one\n", 30, what="attempt 1's output")
    q.output(task, 1, b"", finish=True)
    q.result(task, 1, "failed", final=False, exit_status=1)
    ctl.wait_err("exit status 1")
    q.result(task, 2, "running")
    q.output(task, 2, b"try two\n", finish=True)
    q.result(task, 2, "succeeded", final=True, exit_status=0)
    assert ctl.wait() == 0, ctl.err
    assert ctl.stdout() == b"try one\ntry two\n"
    assert ctl.err == [f"waiting for task {task} to start...", "exit status 1",
                       "== attempt 2 ==", "exit status 0"]


def test_logs_tail_all_and_attempt(q):
    (task,) = q.push("x")
    q.output(task, 1, b"".join(b"first %d\n" % i for i in range(100_000)), finish=True)
    q.result(task, 1, "failed", exit_status=1)
    q.output(task, 2, b"second a\nsecond b\n", finish=True)
    q.result(task, 2, "succeeded", final=True, exit_status=0)
    res = q.run("logs", task)
    assert (res.returncode, res.stdout, res.stderr) == (0, b"second a\nsecond b\n", b"")
    res = q.run("logs", "--attempt", "1", "--tail", "2", task)
    assert (res.returncode, res.stdout) == (0, b"first 99998\nfirst 99999\n"), res.stderr
    res = q.run("logs", "--all", "--tail", "1", task)
    assert res.returncode == 0, res.stderr
    assert res.stdout == b"first 99999\nsecond b\n"
    assert res.stderr.decode().splitlines() == ["== attempt 1 ==", "== attempt 2 =="]
    res = q.run("logs", "--all", task)
    assert res.stdout.count(b"\n") == 100_002


def one_error_line(res: subprocess.CompletedProcess[bytes], code: int) -> str:
    assert res.returncode == code, (res.returncode, res.stdout, res.stderr)
    lines = res.stderr.decode().splitlines()
    assert len(lines) == 1 and lines[0].startswith("jobq-ctl: error: "), res.stderr
    assert res.stdout == b""
    return lines[0]


def test_bad_input_is_one_line(q):
    (task,) = q.push("x")
    assert "no task 'nope' in queue jobs" in one_error_line(q.run("logs", "nope"), 1)
    assert "no task 'nope'" in one_error_line(q.run("logs", "-f", "nope"), 1)
    assert "--control auto" in one_error_line(q.run("--control", "off", "logs", task), 2)
    assert "--control auto" in one_error_line(
        q.run("--control", "off", "push", "-c", "true", "--follow"), 2)
    assert q.backend.size() == 1  # nothing pushed by the refused push --follow
    res = q.run("logs", task)
    assert res.returncode == 0 and res.stderr == \
        f"jobq-ctl: task {task} has no output yet (pending)\n".encode()
    assert "--tail" in one_error_line(q.run("logs", "--tail", "-1", task), 2)


def test_an_unreadable_output_store_is_one_line_exit_1(q):
    (task,) = q.push("x")
    root = Path(output_dir(str(q.db)))
    root.mkdir()
    (root / QUEUE).write_text("not a directory")  # every read of the queue's output fails
    start = time.monotonic()
    line = one_error_line(q.run("logs", task), 1)
    assert time.monotonic() - start < 10
    assert "output store" in line and "Traceback" not in line


def test_ctrl_c_stops_logs_quietly(q):
    _, ctl = _following(q, "x", b"running\n")
    ctl.proc.send_signal(signal.SIGINT)
    assert ctl.wait(30) == 130
    assert ctl.err == []


def test_push_wait_exits_1_when_one_task_failed_and_0_when_all_succeeded(q):
    ctl = q.start("push", "-c", "true", "-c", "false", "--wait")
    wait_for(lambda: len(ctl.out) == 2, 30, what="the two ids")
    ok, bad = (line.decode().strip() for _, line in ctl.out)
    q.result(ok, 1, "succeeded", final=True, exit_status=0)
    q.result(bad, 1, "failed", final=False, exit_status=1)
    q.result(bad, 2, "failed", final=True, exit_status=3)
    assert ctl.wait() == 1, ctl.err
    assert sorted(ctl.err) == sorted([f"{ok} succeeded", f"{bad} failed: exit status 3"])

    ctl = q.start("push", "-c", "true", "--wait")
    wait_for(lambda: ctl.out, 30, what="the id")
    (task,) = (line.decode().strip() for _, line in ctl.out)
    q.result(task, 1, "succeeded", final=True, exit_status=0)
    assert ctl.wait() == 0, ctl.err
    assert ctl.err == [f"{task} succeeded"]


def test_push_follow_streams_output_prefixed_by_task(q):
    ctl = q.start("push", "-c", "echo a", "-c", "echo b", "--follow")
    wait_for(lambda: len(ctl.out) == 2, 30, what="the two ids")
    a, b = (line.decode().strip() for _, line in ctl.out)
    for task, status in ((a, 0), (b, 2)):
        q.result(task, 1, "running")
        q.output(task, 1, f"out of {task}\n".encode(), finish=True)
        q.result(task, 1, "succeeded" if status == 0 else "failed", final=True,
                 exit_status=status)
    assert ctl.wait() == 1, ctl.err
    lines = ctl.stdout().decode().splitlines()
    assert lines[:2] == [a, b]
    assert sorted(lines[2:]) == sorted([f"{a}: out of {a}", f"{b}: out of {b}"])
    assert f"{a} succeeded" in ctl.err and f"{b} failed: exit status 2" in ctl.err


def test_ctrl_c_stops_waiting_not_the_tasks(q, monkeypatch):
    # Unbuffered, the id is out the moment push prints it; a SIGINT sent as soon as it is read
    # lands before the wait proper (the follower's modules still importing): the line that
    # says the tasks go on is printed all the same (it was not, now and then).
    monkeypatch.setenv("PYTHONUNBUFFERED", "1")
    proc = subprocess.Popen(q.args("push", "-c", "sleep 100", "--wait"), env=_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None
    task = proc.stdout.readline().decode().strip()
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130
    assert err.decode().splitlines() == [f"stopped waiting; the tasks go on: {task}"]
    assert q.backend.size() == 1
