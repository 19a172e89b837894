"""Issue 29, "pushed, not polled", for task output: ``jobq-ctl logs -f`` and ``push --follow``
show a printed line within 0.5 s median, ``push --wait`` returns within 0.5 s of the task's
end, on PostgreSQL with NOTIFY (the output store's appends and the control store's result
records notify ``"<schema>.output"``, jobq-ctl LISTENs: fleet/output/postgres_push.py,
ops/follow.py); with ``--postgres-notify off`` the same works at the polling bounds.

Each delay runs from the event: the task stamps the time it printed a line (or ended) itself;
jobq-ctl's lines are timed as they arrive (tests/integration/captured.py)."""

from __future__ import annotations

import os
import random
import signal
import statistics
import threading
from collections.abc import Callable

import psycopg
import pytest

from supervisor.backends.postgres.connect import APP_CTL
from supervisor.core.settings import Settings
from supervisor.fleet.control.postgres import PostgresControlStore
from supervisor.fleet.control.records import ResultRecord
from supervisor.fleet.output.base import AttemptKey
from supervisor.fleet.output.postgres import PostgresOutputStore
from supervisor.fleet.shipper import FLUSH_EVERY, LIVE_FLUSH, OutputShipper
from tests.conftest import wait_for
from tests.integration.captured import Captured
from tests.integration.follow import Follow
from tests.postgres.env import PgEnv

pytestmark = [pytest.mark.timeout(180)]

MEDIAN = 0.5  # s: the bound for a line (logs -f, push --follow) and push --wait
SINGLE = 5.0  # s: one sample alone, on a busy machine
POLLED = 3.0  # s: the polling bound of a line (tests/integration/follow.py) and of an end
LINES = 12


def stamps(lines: int) -> str:
    """A task that prints the time ``lines`` times, at random moments 0.2-0.5 s apart (any
    phase of the worker's and the follower's rounds), then exits 4."""
    gaps = " ".join(f"{random.uniform(0.2, 0.5):.3f}" for _ in range(lines))
    return f"for s in {gaps}; do sleep $s; date +%s.%N; done; exit 4"


def start(pg: PgEnv, *args: str) -> Captured:
    return Follow([*pg.base_args(), *args], {**os.environ, **pg.secret_env()}, str(pg.tmp))


def lags(f: Captured, prefix: bytes = b"") -> list[float]:
    """Arrival minus printing of each stamp line ``f`` printed."""
    return [arrived - float(line.removeprefix(prefix)) for arrived, line in f.out
            if line.startswith(prefix) and b"." in line]


def report(what: str, delays: list[float]) -> float:
    median = statistics.median(delays)
    print(f"{what}: median {median * 1000:.0f} ms: "
          + " ".join(f"{d * 1000:.0f}" for d in delays))
    return median


def ctl_listeners(url: str) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        return int(conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND application_name = %s AND query LIKE 'LISTEN %%'", (APP_CTL,)).fetchone()[0])


@pytest.mark.timing
@pytest.mark.parametrize("notify", ["on", "off"])
def test_logs_follow_and_push_follow_show_lines_pushed(pg: PgEnv, notify: str) -> None:
    """One task followed by ``push --follow`` (which pushed it) and ``logs -f``: every
    stamp arrives at both, in order, and both exit 1 (the task exits 4).  NOTIFY on: median
    <= 0.5 s, each jobq-ctl LISTENs; off: no LISTEN, each line within the polling bound."""
    pg.notify = notify
    pg.serve()
    pusher = start(pg, "push", "--follow", "--max-attempts", "1", "-c", stamps(LINES))
    try:
        wait_for(lambda: pusher.out, 30, what=f"the pushed id\n{pusher.err}")
        task_id = pusher.out[0][1].decode().strip()
        follower = start(pg, "logs", "-f", task_id)
        try:
            follower.wait_err(f"waiting for task {task_id} to start...", 30)
            sup = pg.supervisor("--poll-interval", "0.2")
            wait_for(lambda: follower.out and pusher.out[1:], 60, what="the first lines")
            listening = ctl_listeners(pg.url)
            assert follower.wait(60) == 1, follower.err
            assert pusher.wait(60) == 1, pusher.err
        finally:
            follower.kill()
    finally:
        pusher.kill()
    assert follower.err[-1] == "exit status 4", follower.err
    assert len(lags(follower)) == LINES and len(lags(pusher)) == LINES, (
        follower.text(), pusher.text())
    both = lags(follower) + lags(pusher)
    median = report(f"print -> logs -f / push --follow, notify {notify}", both)
    if notify == "on":
        assert median <= MEDIAN and max(both) <= SINGLE, both
        assert listening == 2  # one LISTEN connection per jobq-ctl
    else:
        assert max(both) <= POLLED, both
        assert listening == 0
    sup.signal(signal.SIGTERM)
    assert sup.wait(30) == 0, sup.log()


@pytest.mark.timing
@pytest.mark.parametrize("notify", ["on", "off"])
def test_push_wait_returns_promptly_after_the_end(pg: PgEnv, notify: str) -> None:
    """``push --wait`` of five tasks that end at random moments 0.3-0.7 s apart, each
    stamping its end: the result line of each comes within 0.5 s median of its end (NOTIFY
    on), and the command returns as promptly after the last; off: within the polling
    bound."""
    pg.notify = notify
    pg.serve()
    sup = pg.supervisor("--poll-interval", "0.2", "-n", "5")
    sup.wait_log(" started: ", 60)
    ends, at = [pg.tmp / f"end-{i}" for i in range(5)], 1.0
    cmds = []
    for end in ends:
        at += random.uniform(0.3, 0.7)
        cmds += ["-c", f"sleep {at:.3f}; date +%s.%N > {end}"]
    waiter = start(pg, "push", "--wait", *cmds)
    try:
        assert waiter.wait(60) == 0, "\n".join(waiter.err)
    finally:
        waiter.kill()
    returned = waiter.err_at[-1]
    ids = [line.decode().strip() for _, line in waiter.out]
    lines = dict(zip(waiter.err, waiter.err_at))
    delays = [lines[f"{tid} succeeded"] - float(end.read_text()) for tid, end in zip(ids, ends)]
    median = report(f"end -> push --wait's line, notify {notify}", delays)
    last = returned - max(float(end.read_text()) for end in ends)
    if notify == "on":
        assert median <= MEDIAN and max(delays) <= SINGLE, delays
        assert last <= SINGLE, last
    else:
        assert max(delays) <= POLLED, delays
    sup.signal(signal.SIGTERM)
    assert sup.wait(30) == 0, sup.log()


def test_appends_finishes_and_result_records_wake_a_watch_of_their_task(pg: PgEnv) -> None:
    """In process: a reader's ``watch`` (its own LISTEN connection and thread) is woken by
    an append, a finish and a result record of a watched task -- task ids with ``/`` too --
    and not by another task's or queue's writes; its thread and connection end with the
    store; with ``notify=False`` it does not LISTEN."""
    pg.serve()
    reader = PostgresOutputStore(pg.url, "jobq", create=False)
    writer = PostgresOutputStore(pg.url, "jobq")
    control = PostgresControlStore(pg.url, "jobq")
    woken = threading.Event()
    try:
        watch = reader.watch("default", ["a/b", "c"], woken.set)
        assert watch is not None
        wait_for(watch.listener.listening.is_set, 30, what="the LISTEN")
        assert watch.changed("a/b") and watch.changed("c")  # set at the LISTEN: read once

        def pushed(task_id: str, write: Callable[[], object]) -> None:
            woken.clear()
            write()
            wait_for(woken.is_set, 30, what=f"the push of {task_id}")
            assert watch.changed(task_id) and not watch.changed(task_id)

        writer.append(AttemptKey("default", "a", 1), b"not watched\n")
        writer.append(AttemptKey("other", "c", 1), b"another queue\n")
        pushed("a/b", lambda: writer.append(AttemptKey("default", "a/b", 1), b"x\n"))
        assert not watch.changed("c")
        pushed("c", lambda: writer.finish(AttemptKey("default", "c", 2)))
        pushed("c", lambda: control.put_results([ResultRecord(
            queue="default", task_id="c", attempt=2, outcome="succeeded", reason="",
            tail="", exit_status=0, worker="vm1:1:aa", when=1.0e9, signal=None,
            started=1.0e9, finished=1.0e9, final=True)]))
        assert not watch.changed("a/b")
        assert ctl_listeners(pg.url) == 1
        reader.close()
        assert not watch.listener.listening.is_set()
        wait_for(lambda: ctl_listeners(pg.url) == 0, 30, what="no LISTEN left")
        silent = PostgresOutputStore(pg.url, "jobq", create=False, notify=False)
        assert silent.watch("default", ["c"], woken.set) is None
        silent.close()
    finally:
        for store in (reader, writer, control):
            store.close()


@pytest.mark.parametrize("notify", ["on", "off"])
def test_workers_write_sooner_only_when_readers_are_pushed(pg: PgEnv, notify: str) -> None:
    """The output-store thread writes every LIVE_FLUSH with NOTIFY on (every FLUSH_EVERY
    off, and on the other backends: tests/unit/test_shipper.py)."""
    pg.notify = notify
    shipper = OutputShipper.for_worker(pg.settings())
    assert shipper is not None
    assert shipper.flush_every == (LIVE_FLUSH if notify == "on" else FLUSH_EVERY)
    sqlite = OutputShipper.for_worker(Settings(sqlite_path=str(pg.tmp / "q.db")))
    assert sqlite is not None and sqlite.flush_every == FLUSH_EVERY
