"""Network faults between a supervisor and its queue service -- Azurite, or the PostgreSQL
server (issue 28) -- (FaultProxy) while its leases are renewed: black-hole, slow links
(0.3-1 s per chunk) and connection resets.  A second supervisor talks to the service directly
and takes over what the first one loses.  Every task completes, two runs of a task never overlap
unless a lock loss was logged (on PostgreSQL: not at all), and nothing is left alive."""

from __future__ import annotations

import random
import signal
import time

import pytest

from tests.conftest import Env
from tests.faults.proxy import FaultProxy
from tests.reliability.runlog import (
    assert_nothing_left,
    check_runs,
    heartbeat_cmd,
    lifeline_of,
    parse_runs,
)

# timing: renewals timed against proxy faults
pytestmark = [pytest.mark.timing, pytest.mark.slow, pytest.mark.timeout(120)]

TASKS = 6
BEATS = 60  # ~6.5 s of work: several renewals of a 4 s visibility timeout
WINDOW = 7.0  # seconds the fault lasts
ARGS = ["-n", "3", "--renew-interval", "1", "--poll-interval", "0.2",
        "--max-attempts", "10", "--retry-delay", "0", "--kill-timeout", "5"]
BACKEND_ARGS = {
    "azurite": ["--visibility-timeout", "4"],
    "postgres": ["--lock-duration", "4", "--reaper-interval", "0.5", "--stale-lock-age", "0"],
}


@pytest.fixture(params=[pytest.param("azurite", marks=pytest.mark.azure),
                        pytest.param("postgres", marks=pytest.mark.postgres)])
def queue(request) -> tuple[str, Env, int]:
    """(backend, its Env, the port of the service the proxy forwards to)."""
    if request.param == "azurite":
        sq = request.getfixturevalue("sq")
        return "azurite", sq, sq.port
    pg = request.getfixturevalue("pg")
    return "postgres", pg, pg.server.port


def _drained(name: str, e) -> bool:
    if name == "postgres":
        return e.rows("SELECT COUNT(*) FROM jobq.jobs WHERE state != 'succeeded'")[0][0] == 0
    return e.count() == 0


def _apply(fault: str, proxy: FaultProxy, rng: random.Random) -> int:
    """Run the fault for WINDOW seconds; return how many disruptions were made."""
    end = time.monotonic() + WINDOW
    n = 0
    if fault == "blackhole":
        proxy.blackhole()
        while time.monotonic() < end:
            time.sleep(0.1)
        proxy.restore()
        return 1
    if fault == "reset":
        proxy.latency(0.3)  # keeps requests in flight long enough for a reset to hit them
    while time.monotonic() < end:
        if fault == "latency":
            proxy.latency(rng.uniform(0.3, 1.0))
            time.sleep(1.0)
        else:
            n += proxy.reset_all()
            time.sleep(rng.uniform(0.2, 0.5))
        n += fault == "latency"
    proxy.latency(0)
    return n


@pytest.mark.parametrize("fault", ["blackhole", "latency", "reset"])
def test_faults_during_renewals(queue, fault):
    name, sq, port = queue
    args = ARGS + BACKEND_ARGS[name]
    rng = random.Random()
    log = sq.tmp / "runs.log"
    ids = sq.ctl("push", "--file", "-",
                 input="".join(heartbeat_cmd(log, BEATS) + "\n" for _ in range(TASKS))
                 ).stdout.split()
    with FaultProxy(("127.0.0.1", port)) as proxy:
        faulty = sq.supervisor(*args, via_port=proxy.port, name="faulty")
        lifelines = [lifeline_of(faulty)]
        wait_for_starts(log, 3, faulty)
        time.sleep(1.2)  # let a renewal or two through first
        direct = sq.supervisor(*args, name="direct")
        lifelines.append(lifeline_of(direct))
        disruptions = _apply(fault, proxy, rng)

        def done() -> bool:
            report = parse_runs(log)
            return all(any(r.end is not None for r in report.runs.get(i, [])) for i in ids)

        deadline = time.monotonic() + 60
        while not (done() and _drained(name, sq)):
            assert time.monotonic() < deadline, (
                f"not done after the {fault}: {parse_runs(log).summary()}\n"
                f"{faulty.log()[-3000:]}")
            for sup in (faulty, direct):
                assert sup.proc.poll() is None, f"{sup.log_path.name} exited:\n{sup.log()}"
            time.sleep(0.3)
        for sup in (faulty, direct):
            sup.signal(signal.SIGTERM)
        for sup in (faulty, direct):
            assert sup.wait(30) == 0, sup.log()[-3000:]
    assert_nothing_left(lifelines)
    report = parse_runs(log)
    check_runs(report, ids, sq.sups)
    flog = faulty.log()
    renew_failures = flog.count("lease renewal failed")
    lost = flog.count("lock lost")
    print(f"{name} {fault}: disruptions={disruptions} {report.summary()} "
          f"renewal failures={renew_failures} lock losses={lost} "
          f"(direct supervisor: {direct.log().count('lock lost')})")
    if fault == "blackhole":
        assert lost >= 1 and report.interrupted >= 1, "the black-hole did not cost a lease"
    if fault == "reset":
        assert disruptions >= 1 and renew_failures + lost >= 1, "no reset hit a renewal"
    if name == "postgres":
        assert not report.overlaps, report.overlaps[:5]
    assert "Traceback" not in flog, flog[-4000:]


def wait_for_starts(log, n: int, sup, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while len(parse_runs(log).runs) < n:
        assert time.monotonic() < deadline, f"{n} tasks did not start:\n{sup.log()}"
        time.sleep(0.1)
