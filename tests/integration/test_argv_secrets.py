"""Issue 39 (4): a credential given on the command line is wiped from the process's argv at
start-up (core/argv_secrets.py): what ``ps`` and ``/proc/PID/cmdline`` show of a running
worker and of a running ``jobq-ctl dashboard`` holds no password, while the option still
works (sys.argv keeps it for the parser)."""

from __future__ import annotations

import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import command, wait_for

pytestmark = pytest.mark.timeout(60)

PASSWORD = "Pa55-w0rd-in-argv"


@pytest.fixture
def silent_server() -> Iterator[int]:
    """A loopback port that accepts connections (the kernel's backlog) and never answers: a
    PostgreSQL client waits there, so the worker stays up in its start-up."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(8)
        yield sock.getsockname()[1]


def cmdline(pid: int) -> str:
    """What every local user reads of the process's command line: NULs as spaces."""
    return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()


def shows_wiped(pid: int, option: str) -> bool:
    """The command line still names ``option`` (the process is alive and the argv area is
    ours) and no longer holds the password."""
    text = cmdline(pid)
    return option in text and PASSWORD not in text


def test_the_workers_postgres_url_password_is_gone_from_ps(env, silent_server):
    url = f"postgresql://jobq:{PASSWORD}@127.0.0.1:{silent_server}/q"
    sup = env.supervisor("--backend", "postgres", "--postgres-url", url, base=False)
    wait_for(lambda: shows_wiped(sup.pid, "--postgres-url"), 20, what="argv wiped")
    assert f"postgresql://jobq:{'*' * len(PASSWORD)}@127.0.0.1:{silent_server}/q" in \
        cmdline(sup.pid)
    ps = subprocess.run(["ps", "-ww", "-o", "args=", "-p", str(sup.pid)], capture_output=True,
                        text=True, timeout=10)
    assert "--postgres-url" in ps.stdout and PASSWORD not in ps.stdout


@pytest.mark.parametrize("backend, option, value, masked", [
    ("storage-queue", "--connection-string",
     f"AccountName=acct;AccountKey={PASSWORD};QueueEndpoint=http://127.0.0.1:9/acct",
     "AccountKey=*****"),
    ("postgres", "--postgres-url", f"host=db password={PASSWORD}", "password=*****"),
])
def test_the_dashboards_connection_strings_are_gone_from_ps(tmp_path, backend, option, value,
                                                            masked):
    """The dashboard is a long-running ``jobq-ctl``: the same wipe, in ctl_entry; its
    options still reach it (it serves: its clients connect when a page asks)."""
    proc = subprocess.Popen(
        [*command("jobq-ctl"), "--backend", backend, option, value, "dashboard", "--bind",
         "127.0.0.1:0"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        cwd=tmp_path)
    try:
        assert proc.stdout is not None
        seen: list[str] = []  # a line or two about its unreachable stores may come first
        while not seen or seen[-1] and "dashboard on http://127.0.0.1:" not in seen[-1]:
            seen.append(proc.stdout.readline())
        assert "dashboard on http://127.0.0.1:" in seen[-1], seen
        text = cmdline(proc.pid)
        assert masked in text and PASSWORD not in text
    finally:
        proc.kill()
        proc.wait(10)


def test_a_command_without_secrets_keeps_its_command_line(env):
    sup = env.supervisor("--poll-interval", "0.1")
    sup.wait_log("started:")
    assert cmdline(sup.pid).endswith(f"--sqlite-path {env.db} --poll-interval 0.1 ")
