"""The test server itself: it runs, every test gets a database of its own, and closing it
leaves no process, port or folder behind."""

from __future__ import annotations

import signal

import psutil
import pytest

from tests.postgres.server import PgServer, wait_port_closed, why_no_server

pytestmark = pytest.mark.timeout(120)


def test_pg_url_is_a_fresh_database(pg_server, pg_url):
    import psycopg

    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (x int)")
        db = conn.execute("SELECT current_database()").fetchone()[0]
        setting = conn.execute("SHOW fsync").fetchone()[0]
    assert db.startswith("t_") and setting == "off"
    assert pg_server.admin("SELECT 1 FROM pg_database WHERE datname=%s", params=(db,))


def test_marker_is_applied(request):
    assert request.node.get_closest_marker("postgres") is not None


def test_server_stops_restarts_and_leaves_nothing_behind():
    if why_no_server():
        pytest.skip(f"PostgreSQL tests: {why_no_server()}")
    import psycopg

    server = PgServer()
    try:
        server.start()
        first = server.pid
        assert first
        assert psutil.Process(first).username() in ("postgres", psutil.Process().username())
        with psycopg.connect(server.url(), connect_timeout=10) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
        with pytest.raises(psycopg.OperationalError):
            psycopg.connect(server.url(password="wrong"), connect_timeout=10)
        server.restart()
        assert server.pid and server.pid != first
        server.stop()
        assert server.pid is None and wait_port_closed(server.port)
        server.start()
        # A frozen server is killed all the same.
        pid = server.pid
        assert pid is not None
        procs = server.processes()
        assert len(procs) > 1  # the postmaster and its background processes
        psutil.Process(pid).send_signal(signal.SIGSTOP)
    finally:
        server.close()
    gone, alive = psutil.wait_procs(procs, timeout=10)
    assert not alive, f"PostgreSQL processes survived: {alive}"
    assert not server.root.exists()
    assert wait_port_closed(server.port)


def test_without_postgresql_the_tests_skip_or_fail_under_ci(monkeypatch):
    """No initdb: one line saying why (the fixture skips with it, or fails under CI)."""
    from tests.postgres import server

    monkeypatch.setattr(server, "find_bindir", lambda: None)
    why = server.why_no_server()
    assert why is not None and "apt-get install postgresql" in why and "\n" not in why
