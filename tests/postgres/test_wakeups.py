"""Acceptance 4 on a real idle ``jobq-supervisor --backend postgres``: a pushed task starts
within 100 ms (median) of its push's commit thanks to LISTEN/NOTIFY, although the worker
polls only every few seconds; with ``--postgres-notify off`` within one poll interval; and
after ``pg_ctl restart`` the worker listens again by itself and is woken as before.

Each push goes through the queue's own ``push`` (its INSERT and NOTIFY in one transaction);
the delay runs from the moment that call returned (the commit) to the task's first line,
which writes ``$EPOCHREALTIME`` (a bash builtin: no process of its own to wait for).  On a
busy machine the worker may run the task before the pushing process even sees its COMMIT
acknowledged: a delay may then be slightly negative."""

from __future__ import annotations

import random
import statistics
import time

import psycopg
import pytest

from supervisor.backends.postgres.backend import PostgresBackend
from supervisor.core.task import Task
from tests.conftest import Supervisor, wait_for
from tests.postgres.env import PgEnv
from tests.postgres.queue import open_queue

pytestmark = [pytest.mark.timeout(240), pytest.mark.timing]

PUSHES = 20
WAKE_MEDIAN = 0.100  # s: the bound
POLL = 5.0  # s: the worker's poll interval with wake-ups, far above the bound


@pytest.fixture
def pusher(pg: PgEnv, close_at_end) -> PostgresBackend:
    """The queue as jobq-ctl opens it (no listener of its own)."""
    return close_at_end(open_queue(pg.url, pg.queue, "pusher", for_ctl=True))


def listeners(url: str) -> list[int]:
    """The server pids of the workers' LISTEN connections to the test's database."""
    with psycopg.connect(url, autocommit=True) as conn:
        return [pid for (pid,) in conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
            "AND application_name = 'jobq-supervisor' AND query LIKE 'LISTEN %%'")]


def first_line_delays(pg: PgEnv, pusher: PostgresBackend, n: int, name: str,
                      timeout: float) -> list[float]:
    """Push ``n`` tasks one at a time, each once the one before ran and a random moment
    later (any phase of the worker's loop); the delay from each push's commit to its task's
    first line."""
    delays = []
    for i in range(n):
        stamp = pg.tmp / f"{name}-{i}"
        task = Task(cmd=f'echo "$EPOCHREALTIME" > {stamp}.tmp && mv {stamp}.tmp {stamp}')
        pusher.push([task])
        committed = time.time()
        wait_for(stamp.exists, timeout, interval=0.002, what=f"task {i} to run")
        delays.append(float(stamp.read_text()) - committed)
        time.sleep(random.uniform(0.15, 0.4))
    return delays


def report(what: str, delays: list[float]) -> float:
    median = statistics.median(delays)
    print(f"{what}: median {median * 1000:.1f} ms, min {min(delays) * 1000:.1f} ms, "
          f"max {max(delays) * 1000:.1f} ms over {len(delays)} pushes: "
          + " ".join(f"{d * 1000:.0f}" for d in delays))
    return median


def wait_listening(url: str, sup: Supervisor, n: int = 1) -> list[int]:
    return wait_for(lambda: len(listeners(url)) == n and listeners(url), 30,
                    what=f"the worker's LISTEN connection\n{sup.log()}")


def test_an_idle_worker_starts_a_pushed_task_within_100ms_median(pg: PgEnv, pusher):
    sup = pg.supervisor("-n", "1", "--poll-interval", str(POLL))
    sup.wait_log(" started: ", 60)
    wait_listening(pg.url, sup)
    delays = first_line_delays(pg, pusher, PUSHES, "wake", POLL * 3)
    median = report("NOTIFY wake-up, push commit -> first line", delays)
    assert median <= WAKE_MEDIAN
    assert sup.proc.poll() is None, sup.log()


def test_with_notify_off_a_task_starts_within_one_poll_interval(pg: PgEnv, pusher):
    poll = 1.5
    sup = pg.supervisor("-n", "1", "--poll-interval", str(poll), "--postgres-notify", "off")
    sup.wait_log(" started: ", 60)
    delays = first_line_delays(pg, pusher, 6, "poll", poll * 4)
    report(f"poll only (--poll-interval {poll:g}s), push commit -> first line", delays)
    assert listeners(pg.url) == []  # no LISTEN connection at all
    # Within one poll interval (and a little for the spawn on a loaded machine); not by a
    # wake-up: those would be well under 100 ms.
    assert max(delays) <= poll + 0.3
    assert statistics.median(delays) > WAKE_MEDIAN


def test_after_a_server_restart_the_worker_listens_again_and_is_woken(pg: PgEnv, pg_server,
                                                                      close_at_end):
    poll = 30.0  # a task started within a second can only have been woken
    sup = pg.supervisor("-n", "1", "--poll-interval", str(poll))
    sup.wait_log(" started: ", 60)
    [before] = wait_listening(pg.url, sup)
    pg_server.restart()
    [after] = wait_listening(pg.url, sup)
    assert after != before
    sup.wait_log("PostgreSQL wake-up listener listening again", 30)
    # The first task after the restart may meet a pooled connection the restart broke (its
    # receive fails once and is retried): it runs, but is not timed.
    pusher = close_at_end(open_queue(pg.url, pg.queue, "pusher", for_ctl=True))
    first_line_delays(pg, pusher, 1, "warm", poll * 2)
    delays = first_line_delays(pg, pusher, 5, "again", poll)
    report("wake-up after pg_ctl restart", delays)
    assert max(delays) < 1.0
    assert "pg-test-s3cret" not in sup.log()


def test_a_worker_of_several_queues_listens_once_and_is_woken_for_each(pg: PgEnv,
                                                                      close_at_end):
    poll = 30.0
    sup = pg.supervisor("-n", "1", "--poll-interval", str(poll), "--queue", "high,low")
    sup.wait_log(" started: ", 60)
    wait_listening(pg.url, sup)  # one LISTEN connection for both queues
    for name in ("low", "high", "low"):
        pusher = close_at_end(open_queue(pg.url, name, "pusher", for_ctl=True))
        delays = first_line_delays(pg, pusher, 1, f"{name}-{time.monotonic()}", poll)
        assert delays[0] < poll / 10, f"queue {name}: not woken ({delays[0]:.1f}s)"
    assert len(listeners(pg.url)) == 1
