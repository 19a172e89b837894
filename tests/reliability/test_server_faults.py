"""Issue 28: the PostgreSQL server goes away while a task runs -- stopped (pg_ctl stop -m fast:
connections cut, new ones refused) or frozen (SIGSTOP of the postmaster and its backends: calls
hang).  Back within the lease: renewals retry and the task lives on.  Gone past it: the task is
killed before the lease the database last set (its locked_until) ends, and when the server comes
back the worker goes on -- it takes the task back, runs it again and runs new tasks.  A server
unreachable at the worker's start: one line, exit 2, no traceback."""

from __future__ import annotations

import re
import time

import pytest

from tests.conftest import Supervisor, marked_processes, wait_for
from tests.integration.helpers import beating_task, death_time, long_sleeps, runs
from tests.postgres.faults import LeaseLog, freeze, thaw
from tests.postgres.server import free_port
from tests.reliability.conftest import RelPgEnv, still_works
from tests.reliability.runlog import lifeline_of

# timing: times kills against the database's lease ends
pytestmark = [pytest.mark.postgres, pytest.mark.timing, pytest.mark.slow,
              pytest.mark.timeout(150)]

LOCK = 10.0  # the kill deadline: 8 s after the last renewal sent (margin 2 s)
WORKER = ["-n", "1", "--lock-duration", "10", "--renew-interval", "1", "--poll-interval", "0.2",
          "--reaper-interval", "1", "--stale-lock-age", "0", "--max-attempts", "5",
          "--retry-delay", "0"]
SHORT = 2.0  # s: an outage the lease outlives
LONG = 14.0  # s: an outage past the lease (the database's locked_until) for sure
RENEWAL_FAILED = re.compile(r"lease renewal failed \((\d+\.\d)s left before the kill deadline\)")


class Outage:
    """The server stopped or frozen, and back (test thread)."""

    def __init__(self, pg: RelPgEnv, how: str) -> None:
        self.pg, self.how = pg, how
        self.frozen: list = []

    def begin(self) -> float:
        if self.how == "stop":
            self.pg.server.stop()
        else:
            self.frozen = freeze(self.pg.server)
        return time.time()

    def end(self) -> None:
        if self.how == "stop":
            self.pg.server.start()
        else:
            thaw(self.frozen)


def running_task(pg: RelPgEnv, first_beats: int) -> tuple[str, Supervisor, LeaseLog]:
    """One beating task (tests/integration/helpers.py) running on a worker, its lease renewed
    at least once; the task's id, the worker, the log of its leases."""
    [task_id] = pg.push(beating_task(pg.tmp / "runs", first_beats=first_beats))
    leases = LeaseLog(pg.url)  # the push made the schema
    sup = pg.supervisor(*WORKER)
    wait_for(lambda: long_sleeps() == 2 and 1 in runs(pg.tmp / "runs"), 30,
             what=f"the task and its children running\n{sup.log()}")
    wait_for(lambda: leases.renewals(task_id, 1) >= 2, 20, what=f"a renewal\n{sup.log()}")
    return task_id, sup, leases


@pytest.mark.parametrize("how", ["stop", "sigstop"])
def test_server_back_within_the_lease_the_task_lives_on(pg, how):
    task_id, sup, leases = running_task(pg, first_beats=120)
    before = leases.renewals(task_id, 1)
    outage = Outage(pg, how)
    outage.begin()
    try:
        time.sleep(SHORT)  # the outage
    finally:
        outage.end()
    wait_for(lambda: leases.renewals(task_id, 1) > before + 1, 15,
             what=f"renewals after the outage\n{sup.log()}")
    wait_for(lambda: pg.job(task_id).get("state") == "succeeded", 60,
             what=f"the task completed\n{sup.log()}")
    log = sup.log()
    assert "lock lost" not in log, log[-4000:]
    # The outage held renewals up (they waited, or failed and were retried), and they went on
    # once the server answered again, the lease whole.
    times = leases.times(task_id, 1)
    gap = max(b - a for a, b in zip(times, times[1:]))
    print(f"{how}: the longest time between two renewals {gap:.2f}s")
    assert gap > SHORT - 0.5, times
    assert pg.job(task_id)["attempt"] == 1
    assert list(runs(pg.tmp / "runs")) == [1] and runs(pg.tmp / "runs")[1][-1][0] == "end"
    still_works(pg, sup)


@pytest.mark.parametrize("how", ["stop", "sigstop"])
def test_server_gone_past_the_lease_the_task_dies_before_it_then_the_worker_goes_on(pg, how):
    task_id, sup, leases = running_task(pg, first_beats=400)
    lifeline = lifeline_of(sup)
    procs = marked_processes(lifeline.token + ":")
    assert procs
    outage = Outage(pg, how)
    began = outage.begin()
    try:
        dead = death_time(procs, LONG - 1)
        assert dead is not None, f"the task outlived the lease with the server gone\n{sup.log()}"
        assert sup.proc.poll() is None, f"the worker exited:\n{sup.log()[-3000:]}"
        time.sleep(max(0.0, began + LONG - time.time()))
        during = sup.log()
    finally:
        outage.end()
    locked_until = leases.locked_until(task_id, 1, before=dead)
    assert locked_until is not None
    print(f"{how}: task dead {dead - began:.2f}s into the outage, "
          f"{locked_until - dead:.2f}s before its locked_until")
    assert dead < locked_until, f"task died {dead - locked_until:.2f}s after its locked_until"
    # Renewals were tried, and each gave up while the server was still gone: a call never
    # takes longer than the time left to the kill deadline, even when nothing answers.
    failed = RENEWAL_FAILED.findall(during)
    assert failed, f"no renewal gave up while the server was gone\n{during[-4000:]}"
    print(f"renewals that failed during the outage (s left): {failed}")
    # The worker goes on: the task is taken back (its lease ran out) and runs again ...
    wait_for(lambda: pg.job(task_id).get("state") == "succeeded", 60,
             what=f"the task run again\n{sup.log()}")
    row = pg.job(task_id)
    assert row["attempt"] == 2, row
    second = runs(pg.tmp / "runs")[2]
    assert second[0][1] > locked_until and second[-1][0] == "end"
    log = sup.log()
    assert f"[{task_id}" in log and "lock lost" in log, log[-4000:]
    # ... and runs new tasks, and stops cleanly
    still_works(pg, sup)


def test_unreachable_server_at_start_is_one_line_exit_2(pg):
    dead_port = free_port()
    t0 = time.monotonic()
    sup = pg.supervisor("-n", "1", via_port=dead_port)
    assert sup.wait(60) == 2, sup.log()
    took = time.monotonic() - t0
    lines = sup.log().strip().splitlines()
    assert len(lines) == 1, lines
    assert str(dead_port) in lines[0] or "127.0.0.1" in lines[0], lines
    assert "Traceback" not in lines[0] and "pg-test-s3cret" not in lines[0], lines
    print(f"exit 2 after {took:.1f}s: {lines[0]}")
