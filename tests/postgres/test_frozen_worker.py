"""A real ``jobq-supervisor --backend postgres`` while the server hangs (SIGSTOP of the postmaster
and its backends: the kernel still acknowledges, so neither tcp_user_timeout nor the server's
statement_timeout ends a call): every call the worker sends ends by its client-side deadline
(backends/postgres/deadlines.py), so the renewal gives up in time and the keeper comes back,
the task dies before its lease could end, the main loop acts on SIGTERM within about a second,
and after the thaw the worker goes on."""

from __future__ import annotations

import signal
import time

import psutil
import pytest

from tests.conftest import wait_for
from tests.integration.helpers import death_time, ready_count, term_times, write_recorder
from tests.postgres.env import PgEnv
from tests.postgres.faults import LeaseLog, freeze, frozen, thaw

# timing: times the kill and the SIGTERM against a hung server
pytestmark = [pytest.mark.timing, pytest.mark.timeout(180)]

LOCK = 6  # s: --lock-duration (renewed every 2 s; the kill deadline 4 s after a renewal)
TERM_WITHIN = 2.0  # s: one poll interval (1 s, the main thread's bound) + a busy machine's


def test_a_freeze_longer_than_the_lease_kills_the_task_in_time_and_the_worker_goes_on(
        pg: PgEnv, pg_server) -> None:
    pg.serve()
    log = LeaseLog(pg.url)
    pidfile, second = pg.tmp / "pid", pg.tmp / "second"
    # a second attempt (the reaper hands the lease back after the thaw) just ends
    [tid] = pg.push(f"[ -e {pidfile} ] && exit 0; echo $$ > {pidfile}; exec sleep 600")
    sup = pg.supervisor("--poll-interval", "1", "--lock-duration", str(LOCK), "-n", "2")
    wait_for(lambda: pidfile.exists() and pidfile.read_text().strip(), 60,
             what="the task to start")
    task = psutil.Process(int(pidfile.read_text()))
    with frozen(pg_server):
        died = death_time([task], 3 * LOCK)
        assert died is not None, f"the task outlived the frozen server\n{sup.log()}"
        # the keeper gave up on its renewal and logged it (its thread is not stuck)
        wait_for(lambda: "lease renewal failed" in sup.log(), 10,
                 what=f"the renewal's give-up line\n{sup.log()}")
    locked_until = log.locked_until(tid, 1, before=died)
    assert locked_until is not None
    print(f"task died {locked_until - died:.2f}s before its locked_until")
    assert died < locked_until, f"the task died {died - locked_until:.2f}s after its lease"
    pg.push(f"touch {second}")
    wait_for(second.exists, 60, what=f"a new task after the thaw\n{sup.log()}")
    assert sup.proc.poll() is None
    sup.signal(signal.SIGTERM)
    assert sup.wait(60) == 0, sup.log()


def test_sigterm_during_a_freeze_reaches_the_task_within_a_second(pg: PgEnv, pg_server) -> None:
    """The main loop polls for its free slot against the hung server (each receive cut at
    one poll interval), and still forwards a SIGTERM to the task at once."""
    pg.serve()
    out = pg.tmp / "term"
    pg.push(f"{write_recorder(pg.tmp)} {out} 0")
    sup = pg.supervisor("--poll-interval", "1", "-n", "2", "--kill-timeout", "5")
    wait_for(lambda: ready_count(out) == 1, 60, what="the task to start")
    procs = freeze(pg_server)
    try:
        # The first receive into the freeze hangs until it is cut and logs; its retry comes
        # a second later ("retrying in 1s") and hangs again: the SIGTERM lands in that one.
        wait_for(lambda: "receive failed" in sup.log(), 30, what=f"a cut receive\n{sup.log()}")
        time.sleep(1.5)
        t0 = time.time()
        sup.signal(signal.SIGTERM)
        wait_for(lambda: term_times(out), 30, what=f"SIGTERM to the task\n{sup.log()}")
        took = term_times(out)[0] - t0
        print(f"the task had SIGTERM {took:.2f}s after the worker")
        assert took < TERM_WITHIN, f"SIGTERM reached the task {took:.2f}s after the worker"
    finally:
        thaw(procs)
    assert sup.wait(60) == 0, sup.log()
