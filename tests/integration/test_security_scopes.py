"""Issue 7, acceptance 4 with cgroups: task limits applied by ``systemd-run --scope``.

Against a real systemd manager (tests/systemd_manager.py: PID 1 of private namespaces, started
once per pytest process that runs this module's tests).  The supervisor runs inside its
namespaces (nsenter), because systemd-run tells the manager its own pid; the test itself
looks from the host, through the task markers.  Skipped, with the reason, where no such
manager can start (not root, no systemd).
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import psutil
import pytest

from tests.conftest import marked_processes, wait_for
from tests.integration.helpers import database_held, death_time
from tests.systemd_manager import running_manager

# A private systemd manager per pytest process that runs tests of this module; managers side
# by side share nothing (their own namespaces, cgroups, /run and /tmp).
pytestmark = pytest.mark.timeout(90)

# Touches every page, so the memory is resident (a cgroup counts that, not address space).
HOG = f"{sys.executable} -c 'b = bytearray(300 * 1024 * 1024); b[::4096] = b\"x\" * len(b[::4096])'"


@pytest.fixture(scope="module")
def manager(tmp_path_factory):
    with running_manager(tmp_path_factory) as m:
        yield m


def start(env, manager, *args: str):
    """A supervisor inside the manager's namespaces; returns it and its real pid."""
    sup = env.supervisor(*args, prefix=tuple(manager.enter()))
    nsenter = psutil.Process(sup.pid)
    real = wait_for(lambda: nsenter.children(), 10, what="supervisor under nsenter")[0]
    return sup, real.pid


def scopes(manager) -> list[str]:
    """Loaded jobq scopes (the start-up probe's included)."""
    out = manager.systemctl("list-units", "--all", "--plain", "--no-legend", "--type=scope",
                            "jobq-*").stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def test_memory_hog_is_killed_in_its_scope(env, manager):
    [hog] = env.push(HOG, extra=("--max-attempts", "1"))
    # Address space is not memory here: a 1 GiB reservation passes a 100M cgroup limit.
    [reserve] = env.push(f"{sys.executable} -c 'import mmap; m = mmap.mmap(-1, 1 << 30)'; "
                         "grep memory /proc/self/cgroup")
    sup, _ = start(env, manager, "--exit-when-empty", "--task-memory-limit", "100M",
                   "--task-limits", "systemd")
    assert sup.wait(60) == 4, sup.log()
    log = sup.log()
    assert "task limits: systemd scopes (system manager" in log
    row = env.job(hog)
    assert row["status"] == "failed"
    if "OOM kills recorded by systemd" in log:
        assert "memory limit 100M exceeded (killed by the OOM killer)" in row["reason"], row
    else:  # cgroup v1 memory controller: systemd cannot tell, the reason stays a guess
        assert row["reason"].startswith("killed by SIGKILL (memory limit 100M exceeded?)"), row
    assert "MemoryError" not in (row["output_tail"] or "")  # killed, not refused
    assert env.job(reserve)["status"] == "succeeded"
    assert "jobq-" in log and ".scope" in log  # the second task printed its own cgroup
    wait_for(lambda: not scopes(manager), 10, what=f"scopes gone: {scopes(manager)}")


def test_tasks_max_caps_a_fork_bomb_of_root(env, manager):
    script = env.tmp / "bomb.py"
    script.write_text(
        "import os, signal, time\n"
        "kids = []\n"
        "for _ in range(100):\n"
        "    try:\n"
        "        pid = os.fork()\n"
        "    except OSError:\n"
        "        break\n"
        "    if pid == 0:\n"
        "        time.sleep(60)\n"
        "        os._exit(0)\n"
        "    kids.append(pid)\n"
        "print('forked', len(kids), flush=True)\n"
        "for pid in kids:\n"
        "    os.kill(pid, signal.SIGKILL)\n"
        "    os.waitpid(pid, 0)\n")
    [tid] = env.push(f"{sys.executable} {script}")
    # As root: RLIMIT_NPROC would not bind; TasksMax does.
    sup, _ = start(env, manager, "--exit-when-empty", "--task-max-procs", "12",
                   "--task-limits", "auto")
    assert sup.wait(60) == 0, sup.log()
    log = sup.log()
    assert "task limits: systemd scopes" in log
    forked = int(log.split("forked ")[1].split()[0])
    assert 0 < forked < 12, log
    assert "--task-max-procs is not enforced" not in log
    assert env.job(tid)["status"] == "succeeded"


def test_group_leader_sigterm_forwarding_and_scope_removal(env, manager):
    [tid] = env.push("sleep 1000 & sleep 1000; true")
    sup, real = start(env, manager, "--task-memory-limit", "1G", "--task-max-procs", "50",
                      "--task-cpu-limit", "60", "--task-limits", "systemd",
                      "--kill-timeout", "5")
    wait_for(lambda: sum(p.name() == "sleep" for p in marked_processes()) == 2, 30,
             what="task running")
    procs = marked_processes()
    [shell] = [p for p in procs if p.name() == "bash"]
    assert os.getpgid(shell.pid) == shell.pid  # systemd-run and prlimit exec'd in place
    assert shell.parent().pid == real
    [unit] = scopes(manager)
    for p in procs:  # the whole tree is in the task's scope
        assert f"/{unit}" in Path(f"/proc/{p.pid}/cgroup").read_text()
    assert "Max cpu time              60" in Path(f"/proc/{shell.pid}/limits").read_text()
    os.kill(real, signal.SIGTERM)
    assert sup.wait(30) == 0, sup.log()
    assert env.job(tid)["status"] == "pending"  # requeued, as always on shutdown
    wait_for(lambda: not scopes(manager), 10, what="scope gone")


@pytest.mark.timing  # the task must die before locked_until
def test_lock_loss_kills_the_task_in_its_scope(env, manager):
    [tid] = env.push('if [ "$JOBQ_ATTEMPT" = 1 ]; then sleep 60 & sleep 60; true; fi')
    sup, _ = start(env, manager, "--lock-duration", "6", "--renew-interval", "1",
                   "--reaper-interval", "1", "--stale-lock-age", "0", "--exit-when-empty",
                   "--retry-delay", "0", "--task-memory-limit", "1G", "--task-limits", "systemd")
    wait_for(lambda: sum(p.name() == "sleep" for p in marked_processes()) == 2, 30,
             what="task running")
    procs = marked_processes()
    wait_for(lambda: env.job(tid)["locked_until"] > env.job(tid)["locked_at"] + 6.5, 20,
             what="a renewal")
    with database_held(env.db, 12) as hold:
        locked_until = hold.locked_until(tid)
        dead = death_time(procs, 11)
        assert dead is not None and dead < locked_until
    assert sup.wait(60) == 0, sup.log()
    assert "lock lost" in sup.log()
    assert env.job(tid)["status"] == "succeeded"
    wait_for(lambda: not scopes(manager), 10, what=f"scopes gone: {scopes(manager)}")
