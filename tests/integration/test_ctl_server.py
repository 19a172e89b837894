"""The tests' jobq-ctl fork server (tests/ctl_server.py): what its ``run`` gives is what
``subprocess.run`` gives the real console script, and it leaves nothing running."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tests import ctl_server
from tests.conftest import REPO, wait_for

SCRIPT = ctl_server.SCRIPT


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Iterator[psutil.Process]:
    """A server of this test's own, started with JOBQ_SQLITE_PATH in its environment (never
    in a request's); at the end it is stopped and nothing of it is left."""
    monkeypatch.setattr(ctl_server, "_server", None)
    monkeypatch.setattr(ctl_server, "_failed", False)
    monkeypatch.delenv("JOBQ_TEST_CTL_FORK", raising=False)
    monkeypatch.setenv("JOBQ_SQLITE_PATH", "/nonexistent/server.db")
    started = ctl_server._get()
    assert started is not None
    monkeypatch.delenv("JOBQ_SQLITE_PATH")
    proc = psutil.Process(started.proc.pid)
    assert proc.environ()["JOBQ_SQLITE_PATH"] == "/nonexistent/server.db"
    yield proc
    wait_for(lambda: not proc.children(recursive=True), 10, what="handlers and commands gone")
    ctl_server.stop()
    assert not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE
    assert not os.path.exists(started.dir)


def _env(**extra: str) -> dict[str, str]:
    return {**{k: v for k, v in os.environ.items() if not k.startswith("JOBQ_")}, **extra}


def test_status_streams_input_environment_and_cwd_are_the_callers(server, tmp_path: Path):
    # stdin (push --file -), cwd (the default jobq.db), the request's environment only:
    # the server's JOBQ_SQLITE_PATH would have made this fail
    res = ctl_server.run([SCRIPT, "push", "--file", "-"], input="true\nfalse\n", env=_env(),
                         cwd=tmp_path, timeout=60)
    assert res.returncode == 0, res.stderr
    assert len(res.stdout.split()) == 2 and "warning" not in res.stdout
    assert res.stderr.startswith("jobq-ctl: warning: no worker has ever served")
    assert (tmp_path / "jobq.db").exists()
    other = tmp_path / "other.db"
    res = ctl_server.run([SCRIPT, "push", "-c", "true"], cwd=tmp_path, timeout=60,
                         env=_env(JOBQ_SQLITE_PATH=str(other)))
    assert res.returncode == 0 and other.exists()
    # the same as the real console script gives, field for field
    for args in (["size"], ["bogus"], ["size", "--queue", "nope"]):
        forked = ctl_server.run([SCRIPT, *args], env=_env(), cwd=tmp_path, timeout=60)
        real = subprocess.run([SCRIPT, *args], env=_env(), cwd=tmp_path, timeout=60,
                              capture_output=True, text=True)
        assert (forked.returncode, forked.stdout, forked.stderr) == (
            real.returncode, real.stdout, real.stderr)
    assert [ctl_server.run([SCRIPT, "size"], env=_env(), cwd=tmp_path).returncode,
            ctl_server.run([SCRIPT, "bogus"], env=_env(), cwd=tmp_path).returncode] == [0, 2]


def _commands(server: psutil.Process) -> list[psutil.Process]:
    """The running commands: the server's grandchildren, under their handlers."""
    found = []
    for handler in server.children():
        with contextlib.suppress(psutil.NoSuchProcess):  # a handler that just ended
            found += handler.children()
    return found


def _command(server: psutil.Process) -> psutil.Process:
    """The one running command."""
    [command] = wait_for(lambda: _commands(server), 30, what="a running command")
    return command


def test_timeout_kills_the_command_and_raises_timeout_expired(server, tmp_path: Path):
    with pytest.raises(subprocess.TimeoutExpired) as caught:
        ctl_server.run([SCRIPT, "push", "-c", "true", "--wait"], env=_env(), cwd=tmp_path,
                       timeout=2)
    assert caught.value.timeout == 2 and len(caught.value.output.split()) == 1
    # killed and reaped by its handler before run raised (the handler may still be exiting)
    assert not _commands(server)


def test_calls_run_side_by_side_and_a_signal_death_is_negative(server, tmp_path: Path):
    results: list[subprocess.CompletedProcess[str]] = []
    waiting = threading.Thread(target=lambda: results.append(ctl_server.run(
        [SCRIPT, "push", "-c", "true", "--wait"], env=_env(), cwd=tmp_path, timeout=60)))
    waiting.start()
    command = _command(server)
    # another call completes while the first one still waits (once its push is in: the
    # command may be found before it created the queue, and size then says there is none)
    wait_for(lambda: ctl_server.run([SCRIPT, "size"], env=_env(), cwd=tmp_path,
                                    timeout=60).stdout == "1\n", 30, what="the pushed task")
    assert waiting.is_alive()
    command.send_signal(signal.SIGTERM)  # the default disposition: not the server's
    waiting.join(60)
    assert results[0].returncode == -signal.SIGTERM, results


def test_jobq_test_ctl_fork_0_runs_the_real_command(monkeypatch, tmp_path: Path):
    monkeypatch.setattr(ctl_server, "_server", None)
    monkeypatch.setattr(ctl_server, "_failed", False)
    monkeypatch.setenv("JOBQ_TEST_CTL_FORK", "0")
    res = ctl_server.run([SCRIPT, "size"], env=_env(), cwd=tmp_path, timeout=60)
    assert res.returncode == 1 and ctl_server._server is None


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_the_server_ends_with_the_pytest_process_that_started_it(tmp_path: Path):
    code = ("import os, sys; from tests import ctl_server; "
            "ctl_server.run([ctl_server.SCRIPT, 'size'], cwd=sys.argv[1]); s = ctl_server._server; "
            "print(s.proc.pid, s.dir, flush=True); os.kill(os.getpid(), 9)")
    res = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True,
                         text=True, cwd=REPO, timeout=60, env=_env())
    assert res.returncode == -signal.SIGKILL, res.stderr
    pid, path = res.stdout.split()
    wait_for(lambda: _gone(int(pid)), 30, what="the server gone")
    assert not os.path.exists(path)
