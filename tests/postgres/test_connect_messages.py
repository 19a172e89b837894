"""Issue 41 §6 (messages) on a real PostgreSQL server, with real processes: a server that
cannot be reached says so -- refused, black-holed (no answer) or closed before it answered
(a proxy whose server is gone), never "the server terminated abnormally"; a ``.pgpass``
line whose database field does not match names the file and the field instead of a bare
"no password supplied"; a lost lease says that the expired-lease pass takes the task back
(there is no broker)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import psycopg
import pytest

from tests.conftest import command
from tests.faults.proxy import FaultProxy
from tests.integration.helpers import lock_loss_line
from tests.postgres.server import PASSWORD, free_port

pytestmark = pytest.mark.timeout(120)


def _run(name: str, *args: str, cwd: Path, env: dict[str, str] | None = None):
    """One command without the caller's JOBQ_ and PG* variables."""
    full = {k: v for k, v in os.environ.items() if not k.startswith(("JOBQ_", "PG"))}
    full.update(env or {})
    return subprocess.run([*command(name), *args], cwd=cwd, env=full, text=True,
                          capture_output=True, timeout=90)


def _lines(url: str, tmp_path: Path, env: dict[str, str] | None = None) -> list[str]:
    """The one error line of the worker at start (exit 2) and of jobq-ctl size (exit 1)."""
    out = []
    for name, args, code in (("jobq-supervisor", [], 2), ("jobq-ctl", ["size"], 1)):
        res = _run(name, "--backend", "postgres", "--postgres-url", url, *args, cwd=tmp_path,
                   env=env)
        lines = [x for x in res.stderr.splitlines() if "cannot connect to" in x]
        assert res.returncode == code and len(lines) == 1, (res.returncode, res.stderr)
        assert lines[0].startswith(f"{name}: error: PostgreSQL: cannot connect to 127.0.0.1:")
        assert PASSWORD not in res.stderr
        out.append(lines[0])
    return out


def test_a_closed_port_says_connection_refused(tmp_path) -> None:
    url = f"postgresql://postgres:{PASSWORD}@127.0.0.1:{free_port()}/x"
    for line in _lines(url, tmp_path):
        assert "could not be reached: connection refused (nothing listens" in line, line


def test_a_proxy_without_its_server_is_unreachable_not_a_crash(tmp_path) -> None:
    with FaultProxy(("127.0.0.1", free_port())) as proxy:  # its target: nothing listens
        url = f"postgresql://postgres:{PASSWORD}@127.0.0.1:{proxy.port}/x"
        for line in _lines(url, tmp_path):
            assert "could not be reached: the connection was closed before it answered" \
                in line, line
            assert "terminated abnormally" not in line, line


def test_a_black_holed_server_says_no_answer(tmp_path, pg_server) -> None:
    with FaultProxy(("127.0.0.1", pg_server.port)) as proxy:  # accepts, forwards nothing
        proxy.blackhole()
        url = f"postgresql://postgres:{PASSWORD}@127.0.0.1:{proxy.port}/x?connect_timeout=2"
        for line in _lines(url, tmp_path):
            assert "could not be reached: no answer within 2 s (connect_timeout)" in line, line


def test_a_pgpass_line_for_another_database_is_named(tmp_path, pg_server, pg_url) -> None:
    db = pg_url.rsplit("/", 1)[1]
    home = tmp_path / "home"
    home.mkdir()
    passfile = home / ".pgpass"
    passfile.write_text(f"127.0.0.1:{pg_server.port}:{db}:postgres:{PASSWORD}\n")
    passfile.chmod(0o600)
    env = {"HOME": str(home), "PGPASSFILE": str(passfile)}
    ok = _run("jobq-ctl", "--backend", "postgres", "--postgres-url",
              f"postgresql://postgres@127.0.0.1:{pg_server.port}/{db}", "migrate",
              cwd=tmp_path, env=env)
    assert ok.returncode == 0, ok.stderr  # the file works for its own database
    url = f"postgresql://postgres@127.0.0.1:{pg_server.port}/{db}_typo"
    for line in _lines(url, tmp_path, env):
        assert (f"{passfile} has a line for 127.0.0.1:{pg_server.port} user postgres but for "
                f"database '{db}', not '{db}_typo': the database field (the third) must name "
                "the database, or be *") in line, line


def test_a_lost_lease_on_postgres_says_the_expired_lease_pass_takes_it_back(pg) -> None:
    def steal(task_id: str) -> None:  # the next renewal is refused
        with psycopg.connect(pg.url, autocommit=True) as conn:
            conn.execute("UPDATE jobq.jobs SET owner='stolen' WHERE id=%s", (task_id,))

    line, log = lock_loss_line(pg, steal)
    assert "not settled: a worker's expired-lease pass takes the task back once its lock " \
           "has expired" in line, line
    for untrue in ("through the broker", "hands the message out", "hand the message out"):
        assert untrue not in log, log
