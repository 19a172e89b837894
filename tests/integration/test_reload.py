"""Issue 40 (3): a reload (SIGUSR2, the unit's ``systemctl reload``) re-reads the config file of a
real jobq-supervisor while a task runs; it never stops or drains the worker.  A new log level
applies at once, other changes are named as waiting for the next restart, a broken file is one
ERROR line, and the worker goes on serving tasks through all of it.  In systemd:
test_reload_systemd.py."""

from __future__ import annotations

import signal

import pytest

from tests.conftest import Supervisor, marked_processes, wait_for

pytestmark = pytest.mark.timeout(120)

INI = "[jobq-supervisor]\nlog-level = {level}\nnum-workers = {n}\npoll-interval = 0.2\n"


def lines(sup: Supervisor, level: str) -> list[str]:
    return [ln for ln in sup.log().splitlines() if f" {level} " in ln]


def test_reload_applies_the_log_level_and_the_worker_goes_on(env):
    ini = env.tmp / "worker.ini"
    ini.write_text(INI.format(level="INFO", n=2))
    [long] = env.push("sleep 300")
    # renewals every second: DEBUG lines ("Lock renewed till") to look for
    sup = env.supervisor("--config", str(ini), "--lock-duration", "9", "--renew-interval", "1")
    wait_for(lambda: env.state(long) == "running" and marked_processes(), 30,
             what="the long task running")
    task = marked_processes()
    assert not lines(sup, "DEBUG")

    ini.write_text(INI.format(level="DEBUG", n=2))
    sup.signal(signal.SIGUSR2)
    sup.wait_log(f"SIGUSR2 received: reload of {ini}: log-level INFO -> DEBUG", 30)
    wait_for(lambda: any("Lock renewed till" in ln for ln in lines(sup, "DEBUG")), 30,
             what="DEBUG lines after the reload")

    ini.write_text(INI.format(level="DEBUG", n=3))
    sup.signal(signal.SIGUSR2)
    sup.wait_log("take effect only at the next restart", 30)
    [later] = [ln for ln in lines(sup, "WARNING") if "next restart" in ln]
    assert later.endswith("): num-workers"), later

    ini.write_text(INI.format(level="DEBUG", n="many"))
    sup.signal(signal.SIGUSR2)
    sup.wait_log("reload refused", 30)
    [error] = lines(sup, "ERROR")
    assert f"{ini} line 3: num-workers: invalid int value 'many'" in error, error

    # Through all of it: the same process, the long task untouched, new work served.
    assert sup.proc.poll() is None and "draining" not in sup.log() and "stopping" not in sup.log()
    assert all(p.is_running() for p in task) and env.state(long) == "running"
    [short] = env.push("echo served-after-reloads")
    wait_for(lambda: env.state(short) == "succeeded", 30, what="a task pushed after reloads")
    assert env.state(long) == "running"
    sup.signal(signal.SIGTERM)
    assert sup.wait(30) == 0, sup.log()[-3000:]
    assert "requeued=1" in sup.log().splitlines()[-1]


def test_a_draining_worker_ignores_a_reload(env):
    go = env.tmp / "go"
    [long] = env.push(f"while [ ! -e {go} ]; do sleep 0.05; done; echo done")
    sup = env.supervisor("--poll-interval", "0.2")
    wait_for(lambda: env.state(long) == "running", 30, what="the task running")
    sup.signal(signal.SIGUSR1)
    sup.wait_log("draining", 30)
    sup.signal(signal.SIGUSR2)
    sup.wait_log("SIGUSR2 received: reload ignored while draining", 30)
    go.touch()
    assert sup.wait(30) == 0, sup.log()[-3000:]
    assert env.state(long) == "succeeded" and "stop='drained (SIGUSR1)'" in sup.log()
