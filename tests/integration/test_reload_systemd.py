"""Issue 40 (3), acceptance: ``systemctl reload`` never stops the service, tested in systemd.

A unit made from the shipped unit's ``Type=``, ``NotifyAccess=``, ``ExecStart=``,
``ExecReload=`` and ``KillMode=`` lines (the paths: this test's tmp dir and venv, as there is
no /opt/jobq in there) runs jobq-supervisor in the tests' private systemd manager
(tests/systemd_manager.py) with a long task.  The reload used to be a drain: the unit ended
``inactive (dead)`` and ``systemctl reload`` blocked until the task ended.  Now it returns
at once, the unit stays ``active (running)`` with the same main process, the task keeps
running, and a task pushed afterwards runs.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.conftest import SESSION_TAG, command, marked_processes, wait_for
from tests.systemd_manager import running_manager

pytestmark = pytest.mark.timeout(120)

SHIPPED = Path(__file__).resolve().parents[2] / "conf" / "jobq-supervisor.service"
KEPT = ("Type=", "NotifyAccess=", "ExecStart=", "ExecReload=", "KillMode=", "KillSignal=")
UNIT = "jobq-reload-test.service"


@pytest.fixture(scope="module")
def manager(tmp_path_factory):
    with running_manager(tmp_path_factory) as m:
        yield m


def unit_text(tmp: Path) -> str:
    """The shipped unit's lines that make a reload what it is, pointed at ``tmp``."""
    kept = [ln for ln in SHIPPED.read_text().splitlines() if ln.startswith(KEPT)]
    assert "ExecReload=/bin/kill -USR2 $MAINPID" in kept, kept
    script = command("jobq-supervisor")
    assert len(script) == 1, script  # the venv's console script
    lines = [ln.replace("/opt/jobq/bin/jobq-supervisor", script[0])
             .replace("/etc/jobq/worker.ini", str(tmp / "worker.ini")) for ln in kept]
    return "\n".join([
        "[Unit]", "Description=jobq reload test", "[Service]", *lines,
        f"WorkingDirectory={tmp}",
        f"Environment=JOBQ_TEST_SESSION={SESSION_TAG}",
        f"StandardOutput=append:{tmp / 'unit.log'}", "StandardError=inherit", ""])


def show(manager, *props: str) -> dict[str, str]:
    out = manager.systemctl("show", f"--property={','.join(props)}", UNIT).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


@pytest.mark.timing  # the reload returns well before the task would end
def test_systemctl_reload_keeps_the_service_and_its_task_running(env, manager):
    ini = env.tmp / "worker.ini"
    ini.write_text(f"[jobq-supervisor]\nsqlite-path = {env.db}\nnum-workers = 2\n"
                   "poll-interval = 0.2\nlog-level = INFO\n")
    [long] = env.push("sleep 600")
    (manager.units / UNIT).write_text(unit_text(env.tmp))
    assert manager.systemctl("daemon-reload").returncode == 0
    log = env.tmp / "unit.log"
    try:
        res = manager.systemctl("start", UNIT)  # Type=notify: returns on READY=1
        assert res.returncode == 0, (res.stderr, log.read_text() if log.exists() else "")
        wait_for(lambda: env.state(long) == "running" and marked_processes(), 30,
                 what="the long task running")
        task = marked_processes()
        before = show(manager, "MainPID")["MainPID"]

        ini.write_text(ini.read_text().replace("log-level = INFO", "log-level = DEBUG"))
        started = time.monotonic()
        res = manager.systemctl("reload", UNIT)
        took = time.monotonic() - started
        assert res.returncode == 0, res.stderr
        assert took < 15, took  # the task runs for 600 s: a drain would block for them

        wait_for(lambda: "log-level INFO -> DEBUG" in log.read_text(), 30,
                 what="the worker's reload line")
        wait_for(lambda: show(manager, "ActiveState")["ActiveState"] == "active", 30,
                 what="the unit active again after the reload")
        state = show(manager, "ActiveState", "SubState", "MainPID")
        assert state == {"ActiveState": "active", "SubState": "running",
                         "MainPID": before}, state
        assert all(p.is_running() for p in task) and env.state(long) == "running"
        assert "draining" not in log.read_text()

        [short] = env.push("echo after-reload")
        wait_for(lambda: env.state(short) == "succeeded", 30, what="a task pushed after")
        assert env.state(long) == "running"
        assert show(manager, "ActiveState", "SubState")["SubState"] == "running"
    finally:  # the worker requeues the task; a test that failed still leaves nothing behind
        manager.systemctl("stop", "--no-block", UNIT)
        wait_for(lambda: show(manager, "ActiveState")["ActiveState"] in ("inactive", "failed"),
                 60, what="the unit stopped")
    assert env.state(long) == "pending", log.read_text()[-3000:]  # the stop requeued it
