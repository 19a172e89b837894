"""Settlement off the critical path: Storage Queue on Azurite behind a proxy that holds every
DELETE (the settlement of a succeeded task) for a second.  A slot frees when its shell exits,
so tasks keep starting while deletes wait; and the settlements in flight stay bounded
(settlement.py: ``max_settling``, 4 per slot and at least 8), so a slow service does not pile
up threads and held messages."""

from __future__ import annotations

import time

import pytest

from tests.faults.proxy import FaultProxy

pytestmark = [pytest.mark.azure, pytest.mark.timeout(120)]

SLOTS = 2
BOUND = 8  # settlement.py: max(SETTLING_MIN, SETTLING_PER_SLOT * SLOTS)
TASKS = 40


def test_slow_deletes_never_hold_a_slot_and_stay_under_the_bound(sq):
    starts = sq.tmp / "starts"
    cmds = [f"echo $JOBQ_TASK_ID >> {starts}" for _ in range(TASKS)]
    sq.ctl("push", "--file", "-", input="\n".join(cmds) + "\n")
    with FaultProxy(("127.0.0.1", sq.port)) as proxy:
        proxy.delay_requests(b"DELETE ", 1.0)
        sup = sq.supervisor("-n", str(SLOTS), "--exit-when-empty", "--poll-interval", "0.2",
                            via_port=proxy.port)
        ahead = 0  # the most tasks started beyond deletes done + slots, seen at one moment
        deadline = time.monotonic() + 90
        while sup.proc.poll() is None and time.monotonic() < deadline:
            started = len(starts.read_text().split()) if starts.exists() else 0
            with proxy._lock:
                deleted = proxy.held_total - proxy.held
            ahead = max(ahead, started - deleted - SLOTS)
            time.sleep(0.02)
        assert sup.wait(30) == 0, sup.log()[-3000:]
        held_total, held_max = proxy.held_total, proxy.held_max
    ids = starts.read_text().split()
    assert len(ids) == TASKS and len(set(ids)) == TASKS
    assert sq.count() == 0
    assert held_total == TASKS  # every settlement went through the slow path
    # Tasks started while deletes waited: more than the slots' worth ahead of the deletes.
    assert ahead >= SLOTS, f"only {ahead} task(s) started ahead of the slow deletes"
    # The bound: receiving stops at BOUND in flight; one receive may add up to SLOTS - 1.
    assert BOUND // 2 < held_max <= BOUND + SLOTS - 1, held_max
    log = sup.log()
    assert "settlements in flight (the broker is slow to settle)" in log
    assert "settlements caught up" in log
    assert f"succeeded={TASKS}" in log
