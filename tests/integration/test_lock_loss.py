"""Acceptance 4: a task whose lease cannot be renewed dies before its LockedUntil passes."""

from __future__ import annotations

import sqlite3
import threading

import pytest

from tests.conftest import marked_processes, wait_for
from tests.integration.helpers import death_time

pytestmark = pytest.mark.timeout(120)

TASK = 'if [ "$JOBQ_ATTEMPT" = 1 ]; then sleep 60 & sleep 60; true; else echo second-run; fi'


def _hold_exclusive(db, seconds: float, held: threading.Event, release: threading.Event):
    conn = sqlite3.connect(db, timeout=30, isolation_level=None)
    try:
        conn.execute("BEGIN EXCLUSIVE")
        held.set()
        release.wait(seconds)
        conn.execute("ROLLBACK")
    finally:
        conn.close()


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
    held, release = threading.Event(), threading.Event()
    holder = threading.Thread(target=_hold_exclusive, args=(env.db, 15, held, release))
    holder.start()
    try:
        assert held.wait(10)
        # While we hold the lock nobody can write: this LockedUntil is final.
        conn = sqlite3.connect(env.db, timeout=1)
        locked_until = conn.execute("SELECT locked_until FROM jobs WHERE id=?",
                                    (task_id,)).fetchone()[0]
        conn.close()
        dead = death_time(procs, 14)
        assert dead is not None, "task still alive while its lease could not be renewed"
        assert dead < locked_until, (
            f"task died {dead - locked_until:.2f}s after its LockedUntil passed")
        print(f"killed {locked_until - dead:.2f}s before LockedUntil")
        holder.join()  # the full 15 s: the renewals stay stuck all along
    finally:
        release.set()
        holder.join()
    assert sup.wait(60) == 0
    log = sup.log()
    assert "lock lost" in log
    assert f"killed by {signame}" in log
    row = env.job(task_id)
    assert (row["status"], row["attempt"]) == ("succeeded", 2)
    assert "second-run" in log
    assert "released stale running jobs count=1" in log
