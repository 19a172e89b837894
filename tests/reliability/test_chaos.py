"""Chaos: 200 heartbeat-logging tasks, 4 supervisors with short leases, a driver SIGKILLs a random
supervisor every few seconds and starts a new one.  Afterwards every task has a completed run,
no two runs of a task overlap unless a supervisor logged a lock loss for it, and no task process
or lifeline helper is left."""

from __future__ import annotations

import os
import random
import signal
import time

import pytest

from tests.conftest import Env, Supervisor, wait_for
from tests.reliability.runlog import (
    assert_nothing_left,
    check_runs,
    heartbeat_cmd,
    lifeline_of,
    parse_runs,
)

# serial: SIGKILLs supervisors on a schedule: CPU-heavy
pytestmark = [pytest.mark.serial, pytest.mark.slow, pytest.mark.timeout(150)]

TASKS = 200
SUPERVISORS = 4
SLOTS = "2"
LEASE = ["--lock-duration", "4", "--renew-interval", "1"]
COMMON = ["-n", SLOTS, *LEASE, "--poll-interval", "0.2", "--max-attempts", "10",
          "--retry-delay", "0", "--kill-timeout", "5"]
BACKEND_ARGS = {
    "sqlite": ["--reaper-interval", "0.5", "--stale-lock-age", "0"],
    "azurite": [],
}


@pytest.fixture(params=["sqlite", pytest.param("azurite", marks=pytest.mark.azure)])
def queue(request) -> tuple[str, Env]:
    return request.param, request.getfixturevalue("env" if request.param == "sqlite" else "sq")


def _drained(name: str, e: Env) -> bool:
    if name == "sqlite":
        return e.rows("SELECT COUNT(*) FROM jobs WHERE status != 'succeeded'")[0][0] == 0
    return e.count() == 0 and e.count("-failed") == 0  # type: ignore[attr-defined]


def test_chaos_sigkill_supervisors(queue):
    name, e = queue
    seed = int(os.environ.get("CHAOS_SEED", time.time_ns() % 2**32))
    rng = random.Random(seed)
    print(f"chaos seed {seed} (set CHAOS_SEED to replay the schedule)")
    log = e.tmp / "runs.log"
    cmds = [heartbeat_cmd(log, rng.randint(3, 10)) for _ in range(TASKS)]
    ids = e.ctl("push", "--file", "-", input="\n".join(cmds) + "\n").stdout.split()
    assert len(ids) == TASKS

    args = COMMON + BACKEND_ARGS[name]
    lifelines = []
    live: list[Supervisor] = []

    def start() -> None:
        sup = e.supervisor(*args)
        lifelines.append(lifeline_of(sup))
        live.append(sup)

    t0 = time.monotonic()
    for _ in range(SUPERVISORS):
        start()

    def done() -> bool:
        report = parse_runs(log)
        return all(any(r.end is not None for r in report.runs.get(i, [])) for i in ids)

    kills = []
    for _ in range(rng.randint(4, 6)):
        pause_until = time.monotonic() + rng.uniform(1.5, 3.5)
        while time.monotonic() < pause_until:  # the driver's pacing
            time.sleep(0.1)
        if done():
            break
        victim = rng.choice(live)
        victim.signal(signal.SIGKILL)
        assert victim.wait(10) == -signal.SIGKILL
        live.remove(victim)
        kills.append(round(time.monotonic() - t0, 1))
        start()
    for sup in live:
        assert sup.proc.poll() is None, f"a supervisor died by itself:\n{sup.log()[-3000:]}"

    wait_for(lambda: done() and _drained(name, e), 90,
             what=f"all {TASKS} tasks completed and the queue drained", interval=0.5)
    elapsed = time.monotonic() - t0
    for sup in live:
        sup.signal(signal.SIGTERM)
    for sup in live:
        assert sup.wait(30) == 0, sup.log()[-3000:]
    assert_nothing_left(lifelines)

    report = parse_runs(log)
    check_runs(report, ids, e.sups)
    print(f"{name}: {report.summary()} kills at {kills}s; done in {elapsed:.1f}s")
    assert len(kills) >= 4, f"only {len(kills)} kills happened before the work ran out"
    assert report.interrupted >= 1, "no kill hit a running task: the chaos proved nothing"
    for sup in e.sups:
        assert "Traceback" not in sup.log(), sup.log()[-3000:]
