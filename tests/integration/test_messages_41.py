"""Issue 41 §6 (messages), on SQLite with real processes: a queue name over 63 characters is
refused naming the limit, and a task whose lease was lost says how the task really comes
back -- SQLite has no broker: the stale-lock reaper (or the dead-owner pass) takes it back.
The PostgreSQL messages: tests/postgres/test_connect_messages.py."""

from __future__ import annotations

import signal
import sqlite3

import pytest

from tests.conftest import wait_for
from tests.integration.helpers import one_usage_line
from tests.integration.test_config_file_and_queues import run

pytestmark = pytest.mark.timeout(120)


def test_a_queue_name_over_63_characters_names_the_limit(tmp_path) -> None:
    name = "q" * 64
    for cmd, extra in (("jobq-supervisor", ["--check-config"]), ("jobq-ctl", ["size"])):
        res = run(cmd, "--queue", name, *extra, cwd=tmp_path)
        line = one_usage_line(res, "--queue: ")
        assert "is 64 characters long: at most 63" in line, line
    res = run("jobq-supervisor", "--queue", "q" * 63, "--check-config", cwd=tmp_path)
    assert res.returncode == 0, res.stderr


def test_a_lost_lease_on_sqlite_says_the_reaper_takes_it_back(env) -> None:
    [task_id] = env.push("sleep 60")
    sup = env.supervisor("--lock-duration", "6", "--renew-interval", "1", "--poll-interval",
                         "0.2")
    wait_for(lambda: env.state(task_id) == "running", 30, what=f"task running\n{sup.log()}")
    conn = sqlite3.connect(env.db, timeout=30)
    try:
        with conn:  # another worker's lease now: the next renewal is refused
            conn.execute("UPDATE jobs SET token='stolen' WHERE id=?", (task_id,))
    finally:
        conn.close()
    sup.wait_log("finished after lock loss", 30)
    sup.signal(signal.SIGTERM)
    assert sup.wait(30) == 0, sup.log()
    [line] = [x for x in sup.log().splitlines() if "finished after lock loss" in x]
    assert "not settled: a worker's stale-lock reaper takes the task back 6s after its lock " \
           "expired (or the dead-owner pass, once this worker is gone)" in line, line
    for untrue in ("through the broker", "hands the message out", "hand the message out"):
        assert untrue not in sup.log(), sup.log()
