"""Issue 41 §6 (messages), on SQLite with real processes: a queue name over 63 characters is
refused naming the limit, and a task whose lease was lost says how the task really comes
back -- SQLite has no broker: the stale-lock reaper (or the dead-owner pass) takes it back.
The PostgreSQL messages: tests/postgres/test_connect_messages.py."""

from __future__ import annotations

import sqlite3

import pytest

from tests.integration.helpers import lock_loss_line, one_usage_line
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
    def steal(task_id: str) -> None:  # another worker's lease now: the next renewal fails
        conn = sqlite3.connect(env.db, timeout=30)
        try:
            with conn:
                conn.execute("UPDATE jobs SET token='stolen' WHERE id=?", (task_id,))
        finally:
            conn.close()

    line, log = lock_loss_line(env, steal)
    assert "not settled: a worker's stale-lock reaper takes the task back 6s after its lock " \
           "expired (or the dead-owner pass, once this worker is gone)" in line, line
    for untrue in ("through the broker", "hands the message out", "hand the message out"):
        assert untrue not in log, log
