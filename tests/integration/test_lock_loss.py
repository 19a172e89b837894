"""Acceptance 4: a task whose lease cannot be renewed dies before its LockedUntil passes."""

from __future__ import annotations

import pytest

from tests.conftest import marked_processes, wait_for
from tests.integration.helpers import database_held, death_time

# timing: times the kill after a lost lock
pytestmark = [pytest.mark.timing, pytest.mark.timeout(120)]

TASK = 'if [ "$JOBQ_ATTEMPT" = 1 ]; then sleep 60 & sleep 60; true; else echo second-run; fi'


@pytest.mark.parametrize("behavior,signame", [("sigkill", "SIGKILL"), ("sigterm", "SIGTERM")])
def test_lock_loss_kills_task_before_lock_expiry(env, behavior, signame):
    [task_id] = env.push(TASK)
    sup = env.supervisor("--lock-duration", "6", "--renew-interval", "1",
                         "--reaper-interval", "1", "--stale-lock-age", "0",
                         "--exit-when-empty", "--retry-delay", "0",
                         env={"JOBQ_LOCK_LOST_BEHAVIOR": behavior})
    wait_for(lambda: sum(p.name() == "sleep" for p in marked_processes()) == 2, 30,
             what="task and its background grandchild running")
    procs = [p for p in marked_processes() if p.pid != sup.pid]
    # Let a renewal or two happen, then take the database away from the supervisor.
    wait_for(lambda: env.job(task_id)["locked_until"] > env.job(task_id)["locked_at"] + 6.5,
             20, what="a renewal")
    with database_held(env.db, 15) as hold:
        locked_until = hold.locked_until(task_id)
        dead = death_time(procs, 14)
        assert dead is not None, "task still alive while its lease could not be renewed"
        assert dead < locked_until, (
            f"task died {dead - locked_until:.2f}s after its LockedUntil passed")
        print(f"killed {locked_until - dead:.2f}s before LockedUntil")
        hold.thread.join()  # the full 15 s: the renewals stay stuck all along
    assert sup.wait(60) == 0
    log = sup.log()
    assert "lock lost" in log
    assert f"killed by {signame}" in log
    row = env.job(task_id)
    assert (row["status"], row["attempt"]) == ("succeeded", 2)
    assert "second-run" in log
    assert "released stale running jobs count=1" in log
