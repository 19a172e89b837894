"""Issue 13.1: a frozen supervisor (SIGSTOP) cannot let its task outlive the lease -- the
lifeline helper kills the task before its LockedUntil, so a second supervisor's run of it
never overlaps; and in normal operation the lifeline never acts.

The SIGSTOP goes to the supervisor's pid only: its tasks and its lifeline (each in a session
of their own) keep running, as in a debugger stop or a stall of that one process."""

from __future__ import annotations

import re
import signal
import time
from pathlib import Path

import psutil
import pytest

from tests.conftest import Env, Supervisor, marked_processes, wait_for
from tests.integration.helpers import (
    beating_task,
    database_held,
    death_time,
    long_sleeps,
    runs,
    stopped,
)

# timing: times a frozen supervisor's lease deadline
pytestmark = [pytest.mark.timing, pytest.mark.timeout(120)]

LEASE = ["--lock-duration", "6", "--renew-interval", "1", "-n", "1", "--poll-interval", "0.2"]
REAPER = ["--reaper-interval", "1", "--stale-lock-age", "0"]
FREEZE = 15.0
MARGIN = 2.0  # safety_margin(6)


def metric(path: Path, name: str) -> float | None:
    text = path.read_text() if path.exists() else ""
    m = re.search(rf"^{name}(?:{{[^}}]*}})? (\S+)$", text, re.M)
    return float(m.group(1)) if m else None


def start_and_freeze(env: Env, sup: Supervisor, task_id: str) -> tuple[list[psutil.Process],
                                                                         float]:
    """Wait for the long run and a renewal, SIGSTOP the supervisor; return the run's
    processes and the LockedUntil it left behind."""
    wait_for(lambda: long_sleeps() == 2, 30,
             what=f"the task and its children running\n{sup.log()}")
    wait_for(lambda: env.job(task_id)["locked_until"] > env.job(task_id)["locked_at"] + 6.5,
             20, what="a renewal")
    procs = marked_processes()
    sup.signal(signal.SIGSTOP)
    wait_for(lambda: stopped(sup.pid), 5, what="supervisor stopped")
    # Nothing of the frozen supervisor writes any more: this LockedUntil is final.
    return procs, env.job(task_id)["locked_until"]


@pytest.mark.parametrize("behavior,signame", [("sigkill", "SIGKILL"), ("sigterm", "SIGTERM")])
def test_frozen_supervisor_task_dies_before_locked_until(env, behavior, signame):
    log = env.tmp / "runs"
    [task_id] = env.push(beating_task(log))
    metrics = env.tmp / "sup0.prom"
    sup = env.supervisor(*LEASE, "--metrics-file", str(metrics), "--metrics-interval", "0.2",
                         env={"JOBQ_LOCK_LOST_BEHAVIOR": behavior})
    wait_for(lambda: 1 in runs(log), 30, what=f"first run\n{sup.log()}")
    other = env.supervisor(*LEASE, *REAPER)  # takes over what the frozen one loses
    procs, locked_until = start_and_freeze(env, sup, task_id)
    stopped_at = time.time()
    try:
        dead = death_time(procs, 12)
        assert dead is not None, f"task alive {time.time() - locked_until:.1f}s past its " \
                                 f"LockedUntil while its supervisor is frozen\n{sup.log()}"
        assert stopped(sup.pid), "the supervisor woke up: the test proves nothing"
        print(f"{behavior}: task dead {locked_until - dead:.2f}s before LockedUntil")
        assert dead < locked_until, f"task died {dead - locked_until:.2f}s after LockedUntil"
        wait_for(lambda: 2 in runs(log), 30, what=f"the second run\n{other.log()}")
        second_start = runs(log)[2][0][1]
        last_of_first = runs(log)[1][-1][1]
        assert last_of_first < second_start and dead < second_start, (
            f"runs overlap: first seen {last_of_first:.3f}, dead {dead:.3f}, "
            f"second started {second_start:.3f}")
        # Keep it frozen for the whole FREEZE: it must wake to a task already gone.
        time.sleep(max(0.0, stopped_at + FREEZE - time.time()))
    finally:
        sup.signal(signal.SIGCONT)
    sup.wait_log("finished after lock loss")
    wait_for(lambda: metric(metrics, "jobq_tasks_lock_lost_total") == 1, 10,
             what=f"lock-lost metric\n{metrics.read_text() if metrics.exists() else ''}")
    wait_for(lambda: env.job(task_id)["status"] == "succeeded", 30,
             what=f"task completed\n{other.log()}")
    for s in (sup, other):
        s.signal(signal.SIGTERM)
        assert s.wait(30) == 0, s.log()[-3000:]
    text = sup.log()
    assert f"lease deadline passed with no word from the supervisor (frozen?): sent {signame}" \
        in text
    assert text.count("finished after lock loss") == 1, text
    # Logged once, and true: the supervisor wakes to a tree the lifeline already killed.
    # "finished after lock loss" is that line when the main loop reaps the shell first;
    # when the watchdog looks first, it adds one saying the tree was already gone.
    assert text.count("lock lost") <= 1 and "to the task's process tree" not in text, text
    assert f"killed by {signame}" in text
    row = env.job(task_id)
    assert (row["status"], row["attempt"]) == ("succeeded", 2), row
    assert [w for w, _ in runs(log)[2]][-1] == "end"


def test_frozen_supervisor_sigterm_escalates_after_kill_timeout(env):
    """A task that ignores SIGTERM gets SIGKILL --kill-timeout later, the supervisor still
    frozen."""
    trap = "trap '' TERM; "
    [task_id] = env.push(trap + beating_task(env.tmp / "runs"))
    sup = env.supervisor(*LEASE, "--kill-timeout", "2",
                         env={"JOBQ_LOCK_LOST_BEHAVIOR": "sigterm"})
    procs, locked_until = start_and_freeze(env, sup, task_id)
    try:
        wait_for(lambda: "sent SIGTERM to" in sup.log(), 12, what=f"SIGTERM\n{sup.log()}")
        term_seen = time.time()
        dead = death_time(procs, 10)
        assert dead is not None, "a task ignoring SIGTERM was never killed"
        assert stopped(sup.pid), "the supervisor woke up: the test proves nothing"
        print(f"SIGTERM seen {locked_until - term_seen:.2f}s before LockedUntil; "
              f"dead {dead - term_seen:.2f}s after it")
        assert 1.0 < dead - term_seen < 4.0, f"SIGKILL {dead - term_seen:.2f}s after SIGTERM"
        sup.wait_log("sent SIGKILL to", 5)  # written after the kill's last sweep
    finally:
        sup.signal(signal.SIGCONT)
    sup.wait_log("finished after lock loss")


def test_renewal_just_before_the_deadline_is_not_killed(env):
    """Normal operation: a renewal held up by a busy database lands just before the kill
    deadline; the lifeline must have heard of it and leave the task alone."""
    log = env.tmp / "runs"
    [task_id] = env.push(beating_task(log, first_beats=80))
    sup = env.supervisor(*LEASE)
    wait_for(lambda: 1 in runs(log), 30, what=f"first run\n{sup.log()}")
    before = env.job(task_id)["locked_until"]
    wait_for(lambda: env.job(task_id)["locked_until"] > before, 10, what="a renewal")
    locked_until = env.job(task_id)["locked_until"]
    deadline = locked_until - MARGIN  # the watchdog's deadline, as wall time
    hold_for = deadline - 0.6 - time.time()
    assert hold_for > 2.5, "the renewal was seen too late to hold the next one up"
    with database_held(env.db, hold_for) as hold:
        hold.thread.join()
    released = time.time()
    wait_for(lambda: env.job(task_id)["locked_until"] > locked_until, 5,
             what="the held-up renewal")
    print(f"renewal released {deadline - released:.2f}s before the kill deadline")
    assert 0 < deadline - released < 1.0
    wait_for(lambda: env.job(task_id)["status"] == "succeeded", 60,
             what=f"task completed\n{sup.log()}")
    sup.signal(signal.SIGTERM)
    assert sup.wait(30) == 0
    text = sup.log()
    assert "lifeline" not in text and "lock lost" not in text, text
    assert env.job(task_id)["attempt"] == 1
    assert [w for w, _ in runs(log)[1]][-1] == "end"
