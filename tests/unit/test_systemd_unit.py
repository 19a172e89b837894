"""conf/jobq-supervisor.service passes systemd-analyze verify (where it exists)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(60)
def test_unit_file_verifies(tmp_path):
    if not shutil.which("systemd-analyze"):
        pytest.skip("systemd-analyze not installed")
    text = (REPO / "conf" / "jobq-supervisor.service").read_text()
    assert "Type=notify" in text and "KillMode=mixed" in text and "WatchdogSec=" in text
    # The unit names the installed path; point it at this checkout's script for the check.
    script = Path(sys.executable).parent / "jobq-supervisor"
    if not script.exists():
        script = Path(sys.executable)
    unit = tmp_path / "jobq-supervisor.service"
    unit.write_text(text.replace("/opt/jobq/bin/jobq-supervisor", str(script)))
    res = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True,
                         text=True, timeout=50)
    assert res.returncode == 0, res.stderr


def test_the_state_directory_and_what_the_service_creates_are_private():
    """Issue 39 (4): another local user read the queue (tasks' env) and the output."""
    text = (REPO / "conf" / "jobq-supervisor.service").read_text().splitlines()
    assert "UMask=0077" in text and "StateDirectoryMode=0700" in text
    assert "LogsDirectory=jobq" in text and "LogsDirectoryMode=0700" in text  # task logs
    ini = (REPO / "conf" / "worker.ini").read_text().splitlines()
    assert "task-umask = 0022" in ini  # the tasks keep systemd's usual umask


def test_stop_timeout_exceeds_kill_timeout():
    text = (REPO / "conf" / "jobq-supervisor.service").read_text()
    stop = int(text.split("TimeoutStopSec=")[1].split()[0])
    ini = (REPO / "conf" / "worker.ini").read_text()
    kill = ini.split("kill-timeout = ")[1].split()[0]
    from supervisor.core.settings import parse_duration

    assert stop > parse_duration(kill) + 30


def test_reload_is_never_a_stop():
    """Issue 40: ``systemctl reload`` drained the worker (SIGUSR1) and left the unit down; it
    re-reads the configuration (SIGUSR2, worker/reload.py)."""
    text = (REPO / "conf" / "jobq-supervisor.service").read_text().splitlines()
    assert [ln for ln in text if ln.startswith("ExecReload=")] == [
        "ExecReload=/bin/kill -USR2 $MAINPID"]
