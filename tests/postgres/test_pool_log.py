"""What a worker logs while its PostgreSQL server is down: psycopg_pool's own warnings
("error connecting in 'jobq-main': ...", libpq's multi-line messages) come out as one line
each, rate-limited, without the password (connect.py's filter on psycopg's loggers)."""

from __future__ import annotations

import re
import signal
import time

import pytest

from tests.conftest import wait_for
from tests.postgres.env import PgEnv
from tests.postgres.server import PASSWORD

pytestmark = pytest.mark.timeout(180)

RECORD = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} [A-Z]+ ")


def test_a_worker_whose_server_is_stopped_logs_one_line_records(pg: PgEnv, pg_server) -> None:
    pg.serve()
    sup = pg.supervisor("--poll-interval", "0.2", "-n", "2")
    pg.push("true")
    sup.wait_log("finished: exit status 0", 60)
    pg_server.stop()
    try:
        wait_for(lambda: "error connecting in 'jobq-main'" in sup.log(), 60,
                 what=f"the pool's connection errors\n{sup.log()}")
        # the pool retries every 50 ms to a few seconds meanwhile (measured: 3 lines in the
        # first second without the rate limit): no condition to wait for, only time
        time.sleep(3.0)
    finally:
        pg_server.start()
    sup.signal(signal.SIGTERM)
    assert sup.wait(60) == 0, sup.log()
    text = sup.log()
    bad = [line for line in text.splitlines() if line and not RECORD.match(line)]
    assert not bad, f"lines that are not records of their own: {bad[:5]}\n{text}"
    assert PASSWORD not in text
    assert text.count("error connecting in 'jobq-main'") == 1, text  # rate-limited
