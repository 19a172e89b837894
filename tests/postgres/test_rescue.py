"""Rescue of dead hosts on PostgreSQL with real supervisors: a SIGKILLed worker's task runs
again on another live worker within about a minute with ``--lock-duration 30s`` -- taken back
by that worker's expired-lease reaper within 15 s of the lease's ``locked_until`` -- counted
as attempt 2; on its last attempt it is failed with the reason instead.  The killed worker's
lifeline kills its tasks first, so the two runs never overlap."""

from __future__ import annotations

import signal
import time
from datetime import datetime

import pytest

from tests.conftest import Supervisor, wait_for
from tests.integration.helpers import beating_task, kill_and_watch, long_sleeps, runs
from tests.postgres.env import PgEnv

pytestmark = [pytest.mark.timeout(240), pytest.mark.timing, pytest.mark.slow]

TAKEN_BACK_WITHIN = 15.0  # s after locked_until (the bound)
AGAIN_WITHIN = 60.0  # s after the SIGKILL, with --lock-duration 30s


def running(pg: PgEnv, *args: str) -> Supervisor:
    """A worker running the one beating task pushed (attempt 1, with a child in its group
    and one that left it, its start line written)."""
    sup = pg.supervisor("-n", "1", *args, name="killed")
    wait_for(lambda: long_sleeps() == 2 and runs(pg.tmp / "runs").get(1), 60,
             what=f"the task running\n{sup.log()}")
    return sup


def locked_until(pg: PgEnv, task_id: str) -> float:
    """The task's locked_until (epoch s): final once its worker is dead."""
    value = pg.job(task_id)["locked_until"]
    assert isinstance(value, datetime)
    return value.timestamp()


def test_a_killed_workers_task_runs_again_on_another_worker_within_a_minute(pg: PgEnv):
    log = pg.tmp / "runs"
    pg.serve()
    [tid] = pg.push(beating_task(log))
    sup = running(pg, "--lock-duration", "30s")
    other = pg.supervisor("-n", "1", "--lock-duration", "30s", name="other")
    other.wait_log(" started: ", 60)
    killed_at, dead_at = kill_and_watch(sup)
    until = locked_until(pg, tid)
    wait_for(lambda: 2 in runs(log), 90, what=f"the second run\n{other.log()}")
    start = runs(log)[2][0][1]
    print(f"SIGKILL -> tree dead {dead_at - killed_at:.2f}s, -> locked_until "
          f"{until - killed_at:.1f}s, -> running again {start - killed_at:.1f}s "
          f"({start - until:.1f}s after locked_until)")
    assert start - until < TAKEN_BACK_WITHIN
    assert start - killed_at < AGAIN_WITHIN
    assert dead_at < start and runs(log)[1][-1][1] < start, "the two runs overlap"
    wait_for(lambda: pg.job(tid)["state"] == "succeeded", 60, what="succeeded")
    assert pg.job(tid)["attempt"] == 2  # the attempt the dead worker ran counts
    other.signal(signal.SIGTERM)
    assert other.wait(30) == 0
    assert "stopped renewing: took back 1 running task(s)" in other.log()
    assert f"{tid} pending" in other.log()


def test_on_its_last_attempt_a_killed_workers_task_fails_with_the_reason(pg: PgEnv):
    log = pg.tmp / "runs"
    pg.serve()
    [tid] = pg.push(beating_task(log), extra=("--max-attempts", "1"))
    sup = running(pg, "--lock-duration", "10s")
    worker = sup.log().split("worker ", 1)[1].split(" started", 1)[0]
    other = pg.supervisor("-n", "1", name="other")
    other.wait_log(" started: ", 60)
    kill_and_watch(sup)
    wait_for(lambda: pg.job(tid)["state"] == "failed", 60, what=f"failed\n{other.log()}")
    job = pg.job(tid)
    assert job["reason"] == f"lease expired on the last attempt (worker {worker} stopped " \
                            "renewing)"
    assert (job["attempt"], job["worker"], job["owner"]) == (1, worker, None)
    time.sleep(1.0)
    assert 2 not in runs(log)  # never ran again
    failed = pg.ctl("failed").stdout
    assert tid in failed and "lease expired on the last attempt" in failed
    other.signal(signal.SIGTERM)
    assert other.wait(30) == 0
