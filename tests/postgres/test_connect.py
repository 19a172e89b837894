"""backends/postgres/connect.py against a real server: the connection string and its
defaults, the one-line errors (never a password), the two pools, and statements under a
statement timeout."""

from __future__ import annotations

import threading
import time

import pytest

from supervisor.backends.base import BackendConfigError, BackendError
from supervisor.backends.postgres import connect as pg
from supervisor.core.settings import Settings
from supervisor.core.threads import HANDLED_SIGNALS
from tests.postgres.server import PASSWORD, free_port

pytestmark = pytest.mark.timeout(60)


# -- redaction (no server) -------------------------------------------------------------
@pytest.mark.parametrize(("text", "secret"), [
    ("postgresql://jobq:Pa55word@db:5432/x", "Pa55word"),
    ("postgres://jobq:p@ss@word@db/x?sslmode=require", "ss@word"),
    ("connect postgresql://jobq:S3cr%2Ft@db/x failed", "S3cr%2Ft"),
    ("host=db password=hunter22 dbname=x", "hunter22"),
    ("host=db password = 'with space\\' quote' dbname=x", "space"),
    ('host=db PASSWORD="dq secret" dbname=x', "dq secret"),
    ("postgresql://db/x?user=a&password=qu3ry&sslmode=require", "qu3ry"),
])
def test_redact_removes_the_password(text: str, secret: str) -> None:
    out = pg.redact(text)
    assert secret not in out and pg.MASK in out
    assert "db" in out  # the rest stays readable


def test_redact_removes_the_literal_password_anywhere(monkeypatch) -> None:
    monkeypatch.setenv("PGPASSWORD", "envS3cret")
    url = "host=db user=jobq password=litS3cret"
    text = 'auth failed: "litS3cret" and envS3cret for user "jobq"'
    assert pg.redact(text, url) == f'auth failed: "{pg.MASK}" and {pg.MASK} for user "jobq"'


def test_conninfo_defaults_do_not_override_the_url(monkeypatch) -> None:
    for name in ("PGAPPNAME", "PGCONNECT_TIMEOUT", "PGTCPUSERTIMEOUT"):
        monkeypatch.delenv(name, raising=False)
    import psycopg.conninfo

    d = psycopg.conninfo.conninfo_to_dict(pg.conninfo("postgresql://u@h/db", pg.APP_WORKER))
    assert d["application_name"] == "jobq-supervisor" and d["connect_timeout"] == "10"
    assert d["tcp_user_timeout"] == "30000" and d["keepalives"] == "1"
    d = psycopg.conninfo.conninfo_to_dict(
        pg.conninfo("host=h connect_timeout=3 application_name=mine", pg.APP_CTL))
    assert d["application_name"] == "mine" and d["connect_timeout"] == "3"
    monkeypatch.setenv("PGCONNECT_TIMEOUT", "7")  # libpq's own variable wins over ours too
    assert "connect_timeout" not in psycopg.conninfo.conninfo_to_dict(
        pg.conninfo("host=h", pg.APP_CTL))


def test_unparseable_url_is_a_config_error_without_the_password() -> None:
    with pytest.raises(BackendConfigError) as info:
        pg.conninfo("host=h password=Sup3rSecret bogus_option=1", pg.APP_CTL)
    text = str(info.value)
    assert text.startswith("--postgres-url: ") and "Sup3rSecret" not in text
    assert "\n" not in text


# -- connecting ------------------------------------------------------------------------
def _bad_urls(pg_server, pg_url) -> dict[str, str]:
    db = pg_url.rsplit("/", 1)[1]
    return {
        "wrong password": pg_server.url(db, password="Wr0ngPassw0rd"),
        "missing database": pg_server.url("no_such_db", password=PASSWORD),
        "unreachable": f"postgresql://postgres:{PASSWORD}@127.0.0.1:{free_port()}/{db}",
        "TLS refused": pg_url + "?sslmode=require",
    }


@pytest.mark.parametrize("case", ["wrong password", "missing database", "unreachable",
                                  "TLS refused"])
def test_connect_failures_are_one_line_without_the_password(pg_server, pg_url, case) -> None:
    url = _bad_urls(pg_server, pg_url)[case]
    with pytest.raises(BackendConfigError) as fatal:  # the worker at start: exit 2
        pg.connect(url, application_name=pg.APP_WORKER, fatal=True)
    with pytest.raises(BackendError) as soft:  # jobq-ctl (exit 1), a reconnect (retried)
        pg.connect(url, application_name=pg.APP_CTL)
    for exc in (fatal.value, soft.value):
        text = str(exc)
        assert text.startswith("PostgreSQL: cannot connect to 127.0.0.1:"), text
        assert "\n" not in text and PASSWORD not in text and "Wr0ngPassw0rd" not in text
    expected = {"wrong password": "password authentication failed",
                "missing database": 'database "no_such_db" does not exist',
                "unreachable": "could not be reached: connection refused",
                "TLS refused": "server does not support SSL"}[case]
    assert expected in str(fatal.value)


def _settings(url: str, **kw) -> Settings:
    return Settings(backend="postgres", postgres_url=url, **kw)


def _signals_blocked_in(thread_name_prefix: str) -> set[int]:
    """The signals blocked on a live thread whose name starts with the prefix (from
    /proc/self/task/<tid>/status: SigBlk)."""
    for t in threading.enumerate():
        if t.name.startswith(thread_name_prefix) and t.native_id:
            status = open(f"/proc/self/task/{t.native_id}/status").read()
            mask = int(next(line.split()[1] for line in status.splitlines()
                            if line.startswith("SigBlk:")), 16)
            return {s for s in range(1, 65) if mask >> (s - 1) & 1}
    raise AssertionError(f"no thread {thread_name_prefix}*")


def test_two_pools_renewals_do_not_wait_behind_the_main_pool(pg_server, pg_url) -> None:
    pools = pg.open_pools(_settings(pg_url, num_workers=3), for_ctl=False)
    try:
        assert pools.lease is not None and pools.lease.max_size == 3
        assert pools.main.max_size == pg.MAIN_POOL_MAX
        # The pools' threads take none of the supervisor's signals.
        assert set(HANDLED_SIGNALS) <= _signals_blocked_in("jobq-main")
        assert set(HANDLED_SIGNALS) <= _signals_blocked_in("jobq-lease")
        # Every main connection busy (a slow receive, admin queries) ...
        held = [pools.main.getconn(timeout=10) for _ in range(pg.MAIN_POOL_MAX)]
        try:
            start = time.monotonic()
            with pools.lease.connection(timeout=2) as conn:  # ... a renewal goes on at once
                cur = pg.execute(conn, "SELECT current_setting('application_name')",
                                 timeout=2)
                assert cur.fetchone() == ("jobq-supervisor",)
            assert time.monotonic() - start < 2
        finally:
            for conn in held:
                pools.main.putconn(conn)
    finally:
        pools.close()
    assert pools.main.closed and pools.lease.closed


def test_pool_connections_break_within_a_renew_interval(pg_url) -> None:
    """tcp_user_timeout: min(30 s, the renew interval), so a renewal sent into a black-holed
    link fails in time for its retry; a URL's own value wins."""
    import psycopg.conninfo

    def user_timeout(pools: pg.Pools) -> str:
        return psycopg.conninfo.conninfo_to_dict(pools.main.conninfo)["tcp_user_timeout"]

    for settings, expected in ((_settings(pg_url), "30000"),  # lock 300 s: renew every 100 s
                               (_settings(pg_url, lock_duration=30.0), "10000"),
                               (_settings(pg_url + "?tcp_user_timeout=5000"), "5000")):
        pools = pg.open_pools(settings, for_ctl=True)
        try:
            assert user_timeout(pools) == expected
        finally:
            pools.close()


def test_ctl_pools_and_notify_off(pg_url) -> None:
    pools = pg.open_pools(_settings(pg_url, postgres_notify="off"), for_ctl=True)
    try:
        assert pools.lease is None and not pools.prepare
        with pools.main.connection(timeout=10) as conn:
            assert conn.prepare_threshold is None  # PgBouncer transaction mode: no prepares
            assert conn.autocommit
            assert conn.execute("SELECT current_setting('application_name')").fetchone() == (
                "jobq-ctl",)
    finally:
        pools.close()


def test_open_pools_failure_is_exit_2_for_a_worker_and_1_for_ctl(pg_server, pg_url) -> None:
    url = _bad_urls(pg_server, pg_url)["wrong password"]
    # Only threads this test started count: another test's closed pool may still be
    # ending its threads on a loaded machine (pool.close waits 5 s for them, then goes on).
    before = set(threading.enumerate())
    with pytest.raises(BackendConfigError):
        pg.open_pools(_settings(url), for_ctl=False)
    with pytest.raises(BackendError):
        pg.open_pools(_settings(url), for_ctl=True)
    assert not [t for t in set(threading.enumerate()) - before if t.name.startswith("jobq-")]


def test_execute_times_out_on_the_server_and_leaves_the_connection_clean(pg_url) -> None:
    conn = pg.connect(pg_url, application_name=pg.APP_WORKER)
    try:
        start = time.monotonic()
        with pytest.raises(Exception) as info:
            pg.execute(conn, "SELECT pg_sleep(5)", timeout=0.2)
        assert time.monotonic() - start < 3
        err = pg.failure(info.value, "renew")
        assert isinstance(err, BackendError) and "timed out" in str(err)
        # SET LOCAL ended with the transaction: the connection is idle and has no timeout.
        assert conn.info.transaction_status.name == "IDLE"
        assert conn.execute("SHOW statement_timeout").fetchone() == ("0",)
        assert pg.execute(conn, "SELECT %s::int + 1", (41,), timeout=5).fetchone() == (42,)
    finally:
        conn.close()


def test_pool_log_lines_are_redacted(pg_server, pg_url, caplog) -> None:
    """psycopg's own warnings (the pool cannot connect) carry no password either."""
    import logging

    caplog.set_level(logging.DEBUG, logger="psycopg")
    logging.getLogger("psycopg.pool").warning("error connecting: %s",
                                              f"postgresql://u:{PASSWORD}@h/db")
    assert PASSWORD not in caplog.text and pg.MASK in caplog.text
