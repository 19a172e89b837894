"""Task limits: the mechanism picked on this machine, the launcher argv, the failure wording.

Real conditions only: whether this host has systemd as init decides which tests run.
"""

from __future__ import annotations

import os
import signal

import pytest

from supervisor.worker.limits import TaskLimits, TaskUserIds, unit_name

NO_SYSTEMD = not os.path.isdir("/run/systemd/system")


@pytest.mark.skipif(not NO_SYSTEMD, reason="systemd is the init system here")
def test_auto_falls_back_to_rlimits_without_systemd():
    limits = TaskLimits.configure(64 << 20, None, 10, "auto", euid=0)
    assert limits.mechanism == "rlimit"
    assert limits.describe() == "task limits: rlimits via prlimit (per process)"


@pytest.mark.skipif(not NO_SYSTEMD, reason="systemd is the init system here")
def test_systemd_mode_without_systemd_is_one_clear_error():
    with pytest.raises(ValueError) as err:
        TaskLimits.configure(64 << 20, None, None, "systemd", euid=0)
    assert str(err.value) == ("--task-limits systemd: systemd is not the init system (no "
                              "/run/systemd/system)")


def test_no_limits_no_launcher():
    limits = TaskLimits.configure(None, None, None, "auto")
    assert not limits.any and limits.argv_prefix("t:1") == []
    assert limits.describe() == "task limits: none"
    with pytest.raises(ValueError, match="^--task-limits: must be one of"):
        TaskLimits.configure(None, None, None, "cgroups")


def test_systemd_launcher_order_and_unit_name():
    limits = TaskLimits(memory=100 << 20, cpu=60, procs=50, mechanism="systemd",
                        systemd_run="/usr/bin/systemd-run", systemctl="/usr/bin/systemctl",
                        prlimit="/usr/bin/prlimit", setpriv="/usr/bin/setpriv",
                        oom_policy=True)
    assert unit_name("ab12:7") == "jobq-ab12-7.scope"
    argv = limits.argv_prefix("ab12:7", TaskUserIds(999, 995, (995, 27)))
    assert argv == [
        "/usr/bin/systemd-run", "--scope", "--quiet", "--unit=jobq-ab12-7.scope",
        "-p", f"MemoryMax={100 << 20}", "-p", "MemorySwapMax=0", "-p", "OOMPolicy=kill",
        "-p", "TasksMax=50", "--",
        "/usr/bin/prlimit", "--cpu=60:61", "--",  # RLIMIT_CPU only: no --as, no --nproc
        "/usr/bin/setpriv", "--reuid=999", "--regid=995", "--groups=995,27", "--"]
    assert limits.switches_user
    user = TaskLimits(memory=1 << 30, mechanism="systemd", systemd_run="/x/systemd-run",
                      systemctl="/x/systemctl", user_manager=True)
    assert user.argv_prefix("t:1")[:2] == ["/x/systemd-run", "--user"]
    assert "OOMPolicy=kill" not in user.argv_prefix("t:1")


def test_uncertain_systemd_keeps_the_guess():
    """Where systemd cannot record OOM kills (cgroup v1 memory) the reason stays a guess and
    no systemctl runs."""
    limits = TaskLimits(memory=100 << 20, mechanism="systemd", systemctl="/nonexistent",
                        oom_certain=False)
    assert limits.oom_killed("t:1") is None
    assert (limits.annotate_failure("killed by SIGKILL", -signal.SIGKILL, "", "t:1")
            == "killed by SIGKILL (memory limit 100M exceeded?)")
    assert limits.annotate_failure("exit status 3", 3, "", "t:1") == "exit status 3"
