"""Issue 39 §1: a message's environment never reaches a program that runs before the user switch.

With ``--task-user`` and task limits the shell is started through launchers that run as the
supervisor (root): ``systemd-run --scope``, ``prlimit``, ``setpriv``.  A message's
``LD_PRELOAD`` pointed at a library a task could have dropped used to be loaded into them, as
uid 0.  The library here is real: compiled for the test, it appends the real and effective uid
and the executable of every process that loads it to a log.  Every spawn path is tried: the plain
one (Popen switching ids itself, or posix_spawn without a task user), rlimits through prlimit, and
a systemd scope in a private systemd manager (tests/systemd_manager.py).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from tests.integration.test_security import TEST_USER, task_user  # noqa: F401 (fixture)
from tests.systemd_manager import running_manager

pytestmark = pytest.mark.timeout(90)

RECORDER = r"""
#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>
__attribute__((constructor)) static void record(void) {
    char exe[512] = "?";
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) exe[n] = 0;
    int fd = open(LOG, O_WRONLY | O_APPEND | O_CREAT, 0666);
    if (fd < 0) return;
    dprintf(fd, "%d %d %s\n", (int)getuid(), (int)geteuid(), exe);
    close(fd);
}
"""


@pytest.fixture(scope="module")
def library():
    """(library, log): a recorder every user can load and write to."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler to build the recording library")
    top = Path(tempfile.mkdtemp(prefix="jobq-preload-"))
    top.chmod(0o755)
    log = top / "loads.log"
    log.touch()
    log.chmod(0o666)
    src = top / "rec.c"
    src.write_text(RECORDER)
    so = top / "rec.so"
    subprocess.run([cc, "-shared", "-fPIC", f'-DLOG="{log}"', "-o", str(so), str(src)],
                   check=True, capture_output=True, timeout=60)
    so.chmod(0o755)
    yield so, log
    shutil.rmtree(top, ignore_errors=True)


def loads(log: Path) -> list[tuple[int, int, str]]:
    out = []
    for line in log.read_text().splitlines():
        ruid, euid, exe = line.split(" ", 2)
        out.append((int(ruid), int(euid), exe))
    return out


def run_task(env, library, *worker_args: str, prefix: tuple[str, ...] = ()) -> list:
    so, log = library
    log.write_text("")
    [tid] = env.push("id -u", extra=("--env", f"LD_PRELOAD={so}", "--cwd", str(so.parent)))
    sup = env.supervisor("--exit-when-empty", *worker_args, prefix=prefix)
    assert sup.wait(60) == 0, sup.log()
    assert env.job(tid)["status"] == "succeeded", env.job(tid)
    return loads(log)


LAUNCHERS = ("systemd-run", "prlimit", "setpriv")


def check_only_the_task(seen: list, uid: int) -> None:
    assert seen, "the task's own shell should have loaded the library"
    for ruid, euid, exe in seen:
        assert (ruid, euid) == (uid, uid), f"{exe} loaded the message's library as uid {ruid}"
        assert os.path.basename(exe) not in LAUNCHERS, seen
    assert {os.path.basename(exe) for *_, exe in seen} <= {"bash", "id"}, seen


def test_plain_spawn_with_a_task_user(env, library, task_user):  # noqa: F811
    seen = run_task(env, library, "--task-user", TEST_USER)
    check_only_the_task(seen, task_user.pw_uid)


def test_rlimits_with_a_task_user(env, library, task_user):  # noqa: F811
    seen = run_task(env, library, "--task-user", TEST_USER, "--task-limits", "rlimit",
                    "--task-max-procs", "200", "--task-cpu-limit", "60")
    check_only_the_task(seen, task_user.pw_uid)


def test_rlimits_without_a_task_user(env, library):
    # Everything runs as the supervisor here; still, prlimit never sees the message's env.
    seen = run_task(env, library, "--task-limits", "rlimit", "--task-cpu-limit", "60")
    check_only_the_task(seen, os.getuid())


def test_systemd_scope_with_a_task_user(env, library, task_user, tmp_path_factory):  # noqa: F811
    with running_manager(tmp_path_factory, library[0].parent) as manager:
        seen = run_task(env, library, "--task-user", TEST_USER, "--task-limits", "systemd",
                        "--task-memory-limit", "1G", "--task-cpu-limit", "60",
                        prefix=tuple(manager.enter()))
    check_only_the_task(seen, task_user.pw_uid)
