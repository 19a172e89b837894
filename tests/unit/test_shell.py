"""shell.py's spawn paths: the ctypes posix_spawn (glibc) must behave as os.posix_spawn does."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from supervisor.worker import shell

pytestmark = pytest.mark.timeout(30)

GLIBC = (os.confstr("CS_GNU_LIBC_VERSION") or "").startswith("glibc")


def _run(argv: list[str], env: dict[str, str]) -> tuple[str, int]:
    sh = shell.posix_spawn_shell(argv, env)
    assert sh is not None and sh.stdout is not None
    out = sh.stdout.read().decode()
    sh.stdout.close()
    _, status = os.waitpid(sh.pid, 0)
    return out, os.waitstatus_to_exitcode(status)


@pytest.mark.skipif(not GLIBC, reason="the ctypes path is for glibc")
def test_glibc_uses_the_ctypes_path():
    assert shell._LIBC_SPAWN is not None


def test_new_session_env_and_default_signals():
    env = {"PATH": os.environ["PATH"], "GREETING": "grüße"}
    script = ('echo "$GREETING"; echo "$$ $(ps -o sid= -p $$) $(ps -o pgid= -p $$)"; '
              'grep -E "^Sig(Blk|Ign)" /proc/self/status; echo err >&2; exit 3')
    out, rc = _run(["/bin/bash", "-c", script], env)
    lines = out.splitlines()
    assert rc == 3
    assert lines[0] == "grüße"
    pid, sid, pgid = (int(x) for x in lines[1].split())
    assert pid == sid == pgid  # leads its own session and group
    blocked = int(lines[2].split()[1], 16)
    ignored = int(lines[3].split()[1], 16)
    assert blocked == 0
    for sig in (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGTERM):
        assert not ignored & (1 << (sig - 1)), lines[3]
    assert lines[4] == "err"  # stderr shares the pipe


@pytest.mark.parametrize("env", [{"A=B": "x"}, {"": "x"}, {"A": "x\0y"}, {"A\0": "x"}])
def test_strings_the_os_cannot_take_raise_value_error(env):
    with pytest.raises(ValueError):
        shell.posix_spawn_shell(["/bin/bash", "-c", "true"], env)
    with pytest.raises(ValueError):
        shell.posix_spawn_shell(["/bin/bash", "-c", "true\0"], {})


def test_missing_program_raises_os_error_and_leaks_no_descriptor():
    """The first spawn of a process opens the /dev/null every task's stdin is kept on: the
    test used to pass only after a neighbour had spawned (alone, the file's earlier tests
    did; under xdist it could be its worker's first).  So it counts after one spawn, in a
    process of its own, where no other test's thread opens anything meanwhile."""
    code = (
        "import os\n"
        "from supervisor.worker import shell\n"
        "def spawn():\n"
        "    try:\n"
        "        shell.posix_spawn_shell(['/nonexistent/bash', '-c', 'true'], {})\n"
        "    except FileNotFoundError:\n"
        "        return\n"
        "    raise SystemExit('no FileNotFoundError')\n"
        "spawn()  # opens the /dev/null it keeps for every task's stdin\n"
        "before = set(os.listdir('/proc/self/fd'))\n"
        "for _ in range(3):\n"
        "    spawn()\n"
        "after = set(os.listdir('/proc/self/fd'))\n"
        "raise SystemExit(f'leaked {sorted(after - before)}' if after - before else 0)\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=20)
    assert (res.returncode, res.stderr) == (0, "")
