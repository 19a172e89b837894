"""Task output on a PostgreSQL queue, end to end: real supervisors store it in the schema's
output tables (fleet/output/postgres.py), real ``jobq-ctl`` processes read it -- ``logs``,
``logs --tail``, ``logs -f`` live (tests/integration/follow.py, shared with the other
backends), a rerun behind its marker, the cap's marker, retention, a slow database.

``logs`` also reads result records from the control store: the PostgreSQL one
(``--control auto``)."""

from __future__ import annotations

import os
import signal

import psycopg
import pytest

from supervisor.fleet.output.base import DROPPED, RERUN, TRUNCATED, AttemptKey
from supervisor.fleet.output.postgres import PostgresOutputStore
from tests.conftest import wait_for
from tests.integration.follow import Follow, check_live_follow
from tests.integration.test_output_store import GAP
from tests.outstore.conftest import read_all

pytestmark = pytest.mark.timeout(150)


@pytest.fixture
def out(pg):
    store = PostgresOutputStore(pg.url, "jobq", create=False)
    yield store
    store.close()


def stored(store: PostgresOutputStore, task_id: str, attempt: int = 1) -> tuple[bytes, bool]:
    return read_all(store, AttemptKey("default", task_id, attempt))


def test_output_reaches_logs_and_tail_and_is_capped(pg, out):
    (tid,) = pg.push("for i in $(seq 1 5); do echo line-$i; done")
    (big,) = pg.push("head -c 5000 /dev/zero | tr '\\0' x; echo; echo never-stored")
    sup = pg.supervisor("--exit-when-empty", "--task-output-max", "4K")
    assert sup.wait(60) == 0, sup.log()
    assert "output=store (PostgresOutputStore('schema jobq on 127.0.0.1:" in sup.log()
    lines = "".join(f"line-{i}\n" for i in range(1, 6))
    assert stored(out, tid) == (lines.encode(), True)
    assert pg.ctl("logs", tid).stdout == lines
    assert pg.ctl("logs", "--tail", "2", tid).stdout == "line-4\nline-5\n"
    marker = TRUNCATED.format(limit=4096).encode()
    data, complete = stored(out, big)
    assert complete and data == b"x" * 4096 + marker
    assert pg.ctl("logs", big).stdout.encode() == data


@pytest.mark.timing  # holds each line to a 3 s lag, the late follower to 5 s of task
def test_logs_follow_is_live_on_postgres(pg):
    started: list[Follow] = []

    def start(*args: str) -> Follow:
        env = {**os.environ, **pg.secret_env()}
        started.append(Follow([*pg.base_args(), *args], env, str(pg.tmp)))
        return started[-1]

    try:
        check_live_follow(start, lambda cmd: pg.push(cmd, extra=("--max-attempts", "1"))[0],
                          lambda: pg.supervisor("--poll-interval", "0.2"),
                          lines=150)  # 15 s: two Python processes start meanwhile
    finally:
        for f in started:
            f.kill()


def test_a_rerun_follows_its_marker(pg, out, tmp_path):
    ran = tmp_path / "ran"
    (tid,) = pg.push(f"if [ -e {ran} ]; then echo second; exit 0; fi; touch {ran}; "
                     "echo first; sleep 60")
    sup1 = pg.supervisor()
    wait_for(lambda: b"first" in stored(out, tid)[0], 30, what="the first run's output")
    sup1.signal(signal.SIGTERM)
    assert sup1.wait(30) == 0
    assert "back to the queue, attempt not counted" in sup1.log()
    sup2 = pg.supervisor("--exit-when-empty")
    assert sup2.wait(60) == 0
    both = b"first\n" + RERUN.format(attempt=1).encode() + b"second\n"
    assert stored(out, tid) == (both, True)
    assert pg.ctl("logs", tid).stdout.encode() == both
    assert pg.rows("SELECT run FROM jobq.outputs") == [(2,)]


def test_old_output_is_purged_by_a_worker_soon_after_it_starts(pg, out):
    writer = PostgresOutputStore(pg.url, "jobq")
    try:
        old, new = AttemptKey("default", "old-task", 1), AttemptKey("default", "new-task", 2)
        pg.serve()  # the schema, as a worker's start makes it
        for key in (old, new):
            writer.append(key, b"output\n")
            writer.finish(key)
    finally:
        writer.close()
    pg.rows("UPDATE jobq.outputs SET updated_at = now() - interval '8 days' "
            "WHERE task_id = 'old-task' RETURNING 1")
    pg.rows("UPDATE jobq.outputs SET updated_at = now() - interval '6 days' "
            "WHERE task_id = 'new-task' RETURNING 1")
    sup = pg.supervisor()
    wait_for(lambda: out.attempts("default", "old-task") == [], 30, what="the purge")
    assert out.attempts("default", "new-task") == [2]
    assert pg.rows("SELECT count(*) FROM jobq.output_chunks WHERE task_id = 'old-task'") \
        == [(0,)]
    sup.wait_log("purged the output of 1 attempt(s)", 10)
    sup.signal(signal.SIGTERM)
    assert sup.wait(30) == 0


def test_a_locked_output_table_holds_then_drops_output_and_spares_the_lease(pg, out):
    """The database is slow for output only (a transaction holds the output tables locked):
    the output-store thread's statements time out and are retried, output is held up to the
    buffer and then dropped with a marker, and the task's lease, on other connections, never
    notices."""
    release, progress = pg.tmp / "release", pg.tmp / "progress"
    # ~200 KB in 2 s (more than the 64 KiB held), then wait for the release, then one line.
    (tid,) = pg.push(f"for i in $(seq 1 20); do head -c 10000 /dev/zero | tr '\\0' y; echo; "
                     f"sleep 0.1; done; touch {progress}; "
                     f"while [ ! -e {release} ]; do sleep 0.1; done; echo after-lock")
    pg.serve()
    with psycopg.connect(pg.url, autocommit=True) as locker:
        with locker.transaction():
            locker.execute("LOCK TABLE jobq.outputs, jobq.output_chunks IN ACCESS EXCLUSIVE "
                           "MODE")
            sup = pg.supervisor("--exit-when-empty", "--task-log-buffer", "64K",
                                "--lock-duration", "6", "--renew-interval", "2")
            wait_for(progress.exists, 30, what="the task's output printed")
            sup.wait_log("output store unavailable", 40)
            assert "statement_timeout" in sup.log()
    sup.wait_log("output store reachable again", 60)
    release.touch()
    data, complete = wait_for(lambda: (lambda r: r if r[1] else None)(stored(out, tid)), 60,
                              what="the attempt complete after the lock")
    assert sup.wait(60) == 0
    log = sup.log()
    assert pg.job(tid)["state"] == "succeeded" and "lock lost" not in log.lower()
    gaps = [int(n) for n in GAP.findall(data)]
    assert gaps and data.endswith(DROPPED.format(n=gaps[-1]).encode() + b"after-lock\n")
    assert len(GAP.sub(b"", data)) + sum(gaps) == 20 * 10001 + len(b"after-lock\n")
