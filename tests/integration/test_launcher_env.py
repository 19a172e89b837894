"""worker/shell.py: through launchers, the task's shell gets exactly the environment it would
get without them, and the launchers get none of it (issue 39 §1)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from supervisor.worker.shell import launcher_environment, popen_shell

pytestmark = pytest.mark.timeout(30)

PRLIMIT = shutil.which("prlimit")
needs_prlimit = pytest.mark.skipif(PRLIMIT is None, reason="util-linux prlimit is missing")


def shell_env(env: dict[str, str], cmd: str, prefix: list[str]) -> bytes:
    proc = popen_shell(prefix, cmd, env, None, None, None, None, keep=("JOBQ_LIFELINE",))
    out, _ = proc.communicate(timeout=20)
    assert proc.returncode == 0, out
    return out


CASES = [
    {"PATH": "/usr/bin:/bin", "SHLVL": "3"},
    {"PATH": "/usr/bin:/bin"},
    {},
    {"PATH": "/usr/bin:/bin", "MULTI": "a\nb c", "EMPTY": "", "DOLLAR": "$(touch /x) `id` $HOME",
     "UNI": "h\u00e9\u202e", "SHLVL": "a[$(touch /tmp/jobq-shlvl-injection)]", "EQ": "a=b=c"},
    {"PATH": "/usr/bin:/bin", "BASH_FUNC_greet%%": "() { echo hi; }", "JOBQ_LIFELINE": "t:1"},
]


@needs_prlimit
@pytest.mark.parametrize("env", CASES)
def test_the_same_environment_through_launchers(env):
    cmd = "env -0; true"  # a second command: bash keeps itself (its own SHLVL) instead of exec
    direct = shell_env(env, cmd, [])
    via = shell_env(env, cmd, [PRLIMIT, "--"])
    assert sorted(via.split(b"\0")) == sorted(direct.split(b"\0"))
    assert not Path("/tmp/jobq-shlvl-injection").exists()


@needs_prlimit
def test_an_exported_function_still_works_and_odd_names_are_left_out():
    env = {"PATH": "/usr/bin:/bin", "BASH_FUNC_greet%%": "() { echo hi; }", "A.B": "1"}
    out = shell_env(env, "greet; env", [PRLIMIT, "--"])
    assert out.startswith(b"hi\n") and b"A.B=" not in out


@needs_prlimit
def test_the_launcher_sees_only_the_fixed_environment_and_the_memfd_is_closed(tmp_path):
    # A launcher stand-in that records its own environment, then execs the rest.
    spy = tmp_path / "spy"
    spy.write_text(f'#!/bin/sh\nenv > {tmp_path}/launcher-env\nexec "$@"\n')
    spy.chmod(0o755)
    env = {"PATH": "/usr/bin:/bin", "LD_PRELOAD": "/nonexistent/evil.so", "SECRET_X": "s",
           "JOBQ_LIFELINE": "t:7"}
    out = shell_env(env, "ls /proc/$$/fd; echo $LD_PRELOAD", [str(spy)])
    seen = dict(line.split("=", 1) for line in
                (tmp_path / "launcher-env").read_text().splitlines() if "=" in line)
    seen.pop("PWD", None)
    seen.pop("SHLVL", None)  # sh's own
    seen.pop("_", None)
    assert seen == {**launcher_environment(), "JOBQ_LIFELINE": "t:7"}
    lines = [line for line in out.decode().splitlines() if not line.startswith("ERROR: ld.so")]
    assert lines[-1] == "/nonexistent/evil.so"  # the task's own shell has it
    assert sorted(lines[:-1]) == ["0", "1", "2"], out  # no env fd left open


@needs_prlimit
@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None,
                    reason="needs root and setpriv (RLIMIT_NPROC does not bind root)")
def test_the_prelude_never_forks():
    # One process allowed for the user: any fork between the switch and the task's shell fails.
    prefix = [shutil.which("setpriv"), "--reuid=65534", "--regid=65534", "--clear-groups",
              PRLIMIT, "--nproc=1:1", "--"]
    out = shell_env({"PATH": "/usr/bin:/bin", "A": "1"}, "echo $A ok", prefix)
    assert out == b"1 ok\n"
