"""Issue 30 point 4: ``jobq-ctl status --watch`` and ``workers --watch`` -- real jobq-ctl
processes on a real SQLite queue: plain blocks appended on a pipe, the screen redrawn in
place (ANSI home + clear) on a terminal (a pty), and Ctrl-C (SIGINT) ends either with exit
status 0 and no traceback."""

from __future__ import annotations

import os
import pty
import select
import signal
import subprocess
import time
from pathlib import Path

import pytest

from supervisor.backends.sqlite.backend import SqliteBackend
from supervisor.core.task import Task
from supervisor.fleet.control.records import WorkerRecord
from supervisor.fleet.control.sqlite import SqliteControlStore
from tests.conftest import command, wait_for
from tests.integration.captured import Captured

pytestmark = pytest.mark.timeout(60)

CLEAR = b"\x1b[H\x1b[2J"
QUEUE = "jobs"


@pytest.fixture
def db(tmp_path: Path) -> Path:
    """A queue file with one pending task and one live worker record."""
    path = tmp_path / "q.db"
    backend = SqliteBackend(str(path), QUEUE, "test-worker", serve=True)
    store = SqliteControlStore(str(path))
    try:
        backend.push([Task(cmd="echo watched")])
        now = time.time()
        store.put_worker(WorkerRecord(id="vm7:1:aa", queue=QUEUE, host="vm7", pid=4242,
                                      version="0.1.0", state="running", slots_used=0,
                                      slots_total=2, started=now - 60, heartbeat=now,
                                      interval=3600.0))
    finally:
        store.close()
        backend.close()
    return path


def _args(db: Path, *args: str) -> list[str]:
    return [*command("jobq-ctl"), "--sqlite-path", str(db), "--queue", QUEUE, *args]


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("JOBQ_")}


def test_status_watch_appends_plain_blocks_on_a_pipe_and_ends_0_on_ctrl_c(db: Path) -> None:
    ctl = Captured.start(_args(db, "status", "--watch", "0.2"), env=_env())
    try:
        # three headers: two whole blocks before the third (a Ctrl-C may cut the last one)
        wait_for(lambda: ctl.text().count("Every 0.2s: jobq-ctl status") >= 3, 30,
                 what=f"two refreshes\n{ctl.text()}\n{ctl.err}")
        ctl.proc.send_signal(signal.SIGINT)
        assert ctl.wait(30) == 0, ctl.err
    finally:
        ctl.kill()
    out = ctl.text()
    assert "\x1b" not in out  # no escape sequence into a pipe or a file
    blocks = [b for b in out.split("Every 0.2s: ") if b]
    assert len(blocks) >= 3 and out.startswith("Every 0.2s: ")
    for block in blocks[:2]:
        assert "pending=1" in block and "oldest pending:" in block, block
    assert ctl.err == []  # no traceback, no warning


def test_workers_watch_redraws_in_place_on_a_terminal_and_ends_0_on_ctrl_c(db: Path) -> None:
    master, slave = pty.openpty()
    proc = subprocess.Popen(_args(db, "workers", "--watch", "0.2"), stdin=subprocess.DEVNULL,
                            stdout=slave, stderr=subprocess.PIPE, env=_env(),
                            start_new_session=True)
    os.close(slave)
    seen = b""
    try:
        deadline = time.monotonic() + 30
        while seen.count(CLEAR) < 3:  # two whole frames: each ends where the next begins
            assert time.monotonic() < deadline, f"no two redraws: {seen!r}"
            ready, _, _ = select.select([master], [], [], 1.0)
            if ready:
                seen += os.read(master, 65536)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) == 0
        err = proc.stderr.read().decode() if proc.stderr else ""
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        os.close(master)
    assert err == ""  # no traceback
    frames = [f for f in seen.split(CLEAR) if f]
    assert len(frames) >= 3 and seen.startswith(CLEAR)
    assert all(b"Every 0.2s: jobq-ctl workers --queue jobs" in f and b"vm7:1:aa" in f
               for f in frames[:2]), frames


def test_watch_refuses_json_and_several_queues(db: Path) -> None:
    for args, text in ((("status", "--watch", "--json"), "--watch: not with --json"),
                       (("workers", "--watch", "0"), "--watch: must be more than 0"),
                       (("status", "--queue", "jobs,other", "--watch"),
                        "--watch: status --watch takes one queue")):
        res = subprocess.run(_args(db, *args), capture_output=True, text=True, env=_env(),
                             timeout=60)
        assert res.returncode == 2 and res.stdout == ""
        assert res.stderr.startswith(f"jobq-ctl: error: {text}"), res.stderr
        assert len(res.stderr.splitlines()) == 1
