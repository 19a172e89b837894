"""Chaos: heartbeat-logging tasks, several supervisors with short leases, a driver SIGKILLs a
random supervisor every few seconds and starts a new one.  On PostgreSQL (issue 28) the driver
also black-holes the link of one supervisor (tests/faults/proxy.py), freezes a supervisor
(SIGSTOP of it alone), freezes the server (SIGSTOP of the postmaster and its backends) and
restarts it (pg_ctl restart), each once, among the kills.  Afterwards every task has a completed
run, no two runs of a task overlap unless a supervisor logged a lock loss for it (on PostgreSQL:
not at all -- a lost lease's task dies before its locked_until, and only then is it taken
back), no task process of a killed supervisor was alive 1 s after the SIGKILL, and no task
process or lifeline helper is left."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import time
from dataclasses import dataclass

import pytest

from tests.conftest import Env, Supervisor, wait_for
from tests.faults.proxy import FaultProxy
from tests.integration.helpers import stopped
from tests.postgres.faults import frozen
from tests.reliability.runlog import (
    Lifeline,
    assert_nothing_left,
    check_runs,
    heartbeat_cmd,
    lifeline_of,
    parse_runs,
    sigkill_timed,
)

# stress: SIGKILLs supervisors on a schedule (it mostly waits: ~25% of 2 cores)
pytestmark = [pytest.mark.stress, pytest.mark.slow, pytest.mark.timeout(180)]

TASKS = {"sqlite": 200, "azurite": 200, "postgres": 150}
# postgres: work for all its faults, however long they take -- while faults are left, the
# driver tops the queue up (PENDING_LOW, PUSH_MORE) instead of pushing enough for the slowest
# schedule at the start, so the run ends soon after its last fault.
TOP_UP = {"postgres": (40, 60)}
SUPERVISORS = {"sqlite": 4, "azurite": 4, "postgres": 3}
SLOTS = "2"
LEASE = ["--lock-duration", "4", "--renew-interval", "1"]
COMMON = ["-n", SLOTS, *LEASE, "--poll-interval", "0.2", "--max-attempts", "10",
          "--retry-delay", "0", "--kill-timeout", "5"]
BACKEND_ARGS = {
    "sqlite": ["--reaper-interval", "0.5", "--stale-lock-age", "0"],
    "azurite": [],
    "postgres": ["--reaper-interval", "0.5", "--stale-lock-age", "0"],
}
# The faults besides SIGKILL, each once among the kills.  A black-hole and a frozen supervisor
# outlast the 4 s lease (they cost leases: the task dies, another worker runs it again); the
# server's faults stay within it (renewals retry and the tasks live on).
FAULTS = {"sqlite": [], "azurite": [],
          "postgres": ["blackhole", "freeze-supervisor", "freeze-server", "restart-server"]}
OUTAGE = 5.0  # s: a black-holed link, a frozen supervisor (past the 4 s lease)
SERVER_FREEZE = 1.5  # s
# SIGKILLs at least; PostgreSQL's dead-owner rescue has tests of its own (tests/postgres/
# test_rescue.py): here its kills interleave with the server's faults
KILLS = {"sqlite": 4, "azurite": 4, "postgres": 3}
DEAD_WITHIN = 1.0  # s from a supervisor's SIGKILL to the last of its tasks' processes gone


@pytest.fixture(params=["sqlite", pytest.param("azurite", marks=pytest.mark.azure),
                        pytest.param("postgres", marks=pytest.mark.postgres)])
def queue(request) -> tuple[str, Env]:
    fixture = {"sqlite": "env", "azurite": "sq", "postgres": "pg"}[request.param]
    return request.param, request.getfixturevalue(fixture)


def _pending(name: str, e: Env) -> int:
    """Tasks not taken yet (the driver's top-ups; PostgreSQL only)."""
    return e.rows("SELECT COUNT(*) FROM jobq.jobs WHERE state = 'pending'")[0][0]


def _drained(name: str, e: Env) -> bool:
    if name == "sqlite":
        return e.rows("SELECT COUNT(*) FROM jobs WHERE status != 'succeeded'")[0][0] == 0
    if name == "postgres":
        return e.rows("SELECT COUNT(*) FROM jobq.jobs WHERE state != 'succeeded'")[0][0] == 0
    return e.count() == 0 and e.count("-failed") == 0  # type: ignore[attr-defined]


@dataclass
class Running:
    sup: Supervisor
    lifeline: Lifeline
    proxied: bool  # talks to the server through the FaultProxy


def _hold(seconds: float) -> None:
    """The driver's pacing (test thread)."""
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        time.sleep(0.1)


def test_chaos_sigkill_supervisors(queue):
    name, e = queue
    seed = int(os.environ.get("CHAOS_SEED", time.time_ns() % 2**32))
    rng = random.Random(seed)
    print(f"chaos seed {seed} (set CHAOS_SEED to replay the schedule)")
    log = e.tmp / "runs.log"
    cmds = [heartbeat_cmd(log, rng.randint(3, 10)) for _ in range(TASKS[name])]
    ids = e.ctl("push", "--file", "-", input="\n".join(cmds) + "\n").stdout.split()
    assert len(ids) == TASKS[name]

    args = COMMON + BACKEND_ARGS[name]
    lifelines: list[Lifeline] = []
    live: list[Running] = []
    with contextlib.ExitStack() as stack:
        server = getattr(e, "server", None)  # PostgreSQL's (tests/postgres/server.py)
        proxy = None
        if server is not None:
            proxy = stack.enter_context(FaultProxy(("127.0.0.1", server.port)))

        def start(proxied: bool) -> None:
            via = {"via_port": proxy.port} if proxied and proxy is not None else {}
            sup = e.supervisor(*args, **via)
            running = Running(sup, lifeline_of(sup), proxied)
            lifelines.append(running.lifeline)
            live.append(running)

        t0 = time.monotonic()
        for n in range(SUPERVISORS[name]):
            start(proxied=proxy is not None and n == 0)

        def done() -> bool:
            report = parse_runs(log)
            return all(any(r.end is not None for r in report.runs.get(i, [])) for i in ids)

        # PostgreSQL's run lasts as long as its schedule (the driver tops the work up): the
        # fewest kills the checks below ask for (KILLS), beside its four other faults
        actions = ["kill"] * (KILLS[name] if FAULTS[name] else rng.randint(4, 6)) + FAULTS[name]
        rng.shuffle(actions)
        happened: list[tuple[str, float]] = []
        dead_after: list[float] = []
        for action in actions:
            if name in TOP_UP and _pending(name, e) < TOP_UP[name][0]:
                more = [heartbeat_cmd(log, rng.randint(3, 10)) for _ in range(TOP_UP[name][1])]
                ids += e.ctl("push", "--file", "-", input="\n".join(more) + "\n").stdout.split()
            _hold(rng.uniform(1.0, 2.5))  # tasks last 0.3-1 s: each action finds some running
            if done():
                break
            at = round(time.monotonic() - t0, 1)
            if action == "kill":
                victim = rng.choice(live)
                dead_after.append(sigkill_timed(victim.sup, victim.lifeline))
                live.remove(victim)
                start(victim.proxied)
            elif action == "blackhole":
                assert proxy is not None
                proxy.blackhole()
                try:
                    _hold(OUTAGE)
                finally:
                    proxy.restore()
            elif action == "freeze-supervisor":
                victim = rng.choice(live)
                victim.sup.signal(signal.SIGSTOP)
                try:
                    wait_for(lambda pid=victim.sup.pid: stopped(pid), 5,
                             what="supervisor stopped")
                    _hold(OUTAGE)
                finally:
                    victim.sup.signal(signal.SIGCONT)
            elif action == "freeze-server":
                with frozen(server):
                    _hold(SERVER_FREEZE)
            elif action == "restart-server":
                assert server is not None
                server.restart()
            happened.append((action, at))
        for r in live:
            assert r.sup.proc.poll() is None, \
                f"a supervisor died by itself:\n{r.sup.log()[-3000:]}"

        wait_for(lambda: done() and _drained(name, e), 120,
                 what=f"all {len(ids)} tasks completed and the queue drained", interval=0.5)
        elapsed = time.monotonic() - t0
        for r in live:
            r.sup.signal(signal.SIGTERM)
        for r in live:
            assert r.sup.wait(30) == 0, r.sup.log()[-3000:]
    assert_nothing_left(lifelines)

    report = parse_runs(log)
    check_runs(report, ids, e.sups)
    print(f"{name}: {report.summary()} faults {happened}; killed supervisors' tasks dead "
          f"after {[round(d, 2) for d in dead_after]}s; done in {elapsed:.1f}s")
    kills = [a for a, _ in happened if a == "kill"]
    assert len(kills) >= KILLS[name], f"only {len(kills)} kills happened before the work ran out"
    missed = set(FAULTS[name]) - {a for a, _ in happened}
    assert not missed, f"the work ran out before these faults: {missed}"
    slow = [d for d in dead_after if d > DEAD_WITHIN]
    assert not slow, f"a killed supervisor's tasks lived on {slow}s after the SIGKILL"
    assert report.interrupted >= 1, "no kill hit a running task: the chaos proved nothing"
    if name == "postgres":
        assert not report.overlaps, (
            "runs of one task overlapped: "
            + "; ".join(f"{a.task_id}: attempt {a.attempt} last seen {a.last:.3f} > attempt "
                        f"{b.attempt} start {b.start:.3f}" for a, b in report.overlaps[:5]))
    for sup in e.sups:
        assert "Traceback" not in sup.log(), sup.log()[-3000:]
