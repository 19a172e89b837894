"""psycopg's and psycopg_pool's log records through LibraryLogFilter
(supervisor/backends/postgres/library_log.py): one redacted line each, the same message of a
pool once per REPEAT_EVERY (injected clock), the next saying how many were held back."""

from __future__ import annotations

import logging

import pytest

from supervisor.backends.postgres.library_log import REPEAT_EVERY, LibraryLogFilter
from tests.fakes.clock import FakeClock

pytestmark = pytest.mark.timeout(30)

LIBPQ = ('connection failed: connection to server at "127.0.0.1", port 5 failed: Connection '
         'refused\n\tIs the server running on that host and accepting TCP/IP connections?')


class Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))


@pytest.fixture
def pool_log():
    log = logging.getLogger("test.library_log.pool")
    clock = FakeClock(100.0)
    flt = LibraryLogFilter(lambda text: text.replace("s3cret", "***"), clock)
    out = Records()
    log.addFilter(flt)
    log.addHandler(out)
    log.propagate = False
    try:
        yield log, clock, out
    finally:
        log.removeFilter(flt)
        log.removeHandler(out)


def test_a_multi_line_message_is_one_redacted_line(pool_log) -> None:
    log, _, out = pool_log
    log.warning("error connecting in %r: %s", "jobq-main", LIBPQ + " password=s3cret")
    try:
        raise ValueError("first\nsecond")
    except ValueError:
        log.warning("failed", exc_info=True)
    assert len(out.lines) == 2 and all("\n" not in line for line in out.lines), out.lines
    assert out.lines[0].startswith("error connecting in 'jobq-main': connection failed: ")
    assert "Connection refused Is the server running" in out.lines[0]
    assert "s3cret" not in out.lines[0] and "password=***" in out.lines[0]
    assert out.lines[1] == "failed: ValueError: first second"  # no traceback


def test_the_same_message_of_a_pool_is_logged_once_per_interval(pool_log) -> None:
    log, clock, out = pool_log
    for _ in range(5):  # every 200 ms, as the pool retries at times
        log.warning("error connecting in %r: %s", "jobq-main", LIBPQ)
        log.warning("error connecting in %r: %s", "jobq-lease", LIBPQ)
        clock.advance(0.2)
    assert [line.split(":")[0] for line in out.lines] == [
        "error connecting in 'jobq-main'", "error connecting in 'jobq-lease'"]
    clock.advance(REPEAT_EVERY)
    log.warning("error connecting in %r: %s", "jobq-main", LIBPQ)
    assert out.lines[-1].endswith("(4 more like it in the last 31s)"), out.lines[-1]
    log.warning("error connecting in %r: %s", "jobq-main", LIBPQ)  # held back again
    assert len(out.lines) == 3


def test_every_logger_of_psycopg_and_its_pool_is_tamed() -> None:
    """A logger's filter sees only its own records: each of psycopg's loggers has one."""
    import supervisor.backends.postgres.connect  # noqa: F401 (installs the filters)

    for name in ("psycopg", "psycopg.pool", "psycopg.pq", "psycopg_pool.sched"):
        assert any(isinstance(f, LibraryLogFilter) for f in logging.getLogger(name).filters), name
