"""Issue 41 §1 on a real server: ``--postgres-url`` (flag, ``JOBQ_POSTGRES_URL``, INI key)
without ``--backend`` serves the PostgreSQL queue -- the worker used to log
``backend=sqlite``, create ``./jobq.db`` and serve that -- and jobq-ctl pushes to it and
reads it the same way (real processes)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import Supervisor
from tests.integration.test_config_file_and_queues import run

pytestmark = pytest.mark.timeout(120)


def test_postgres_url_alone_serves_the_postgres_queue(tmp_path: Path, pg_url: str) -> None:
    ini = tmp_path / "worker.ini"
    ini.write_text(f"[jobq-supervisor]\nqueue = fleet\npostgres-url = {pg_url}\n")
    # jobq-ctl: the schema with the flag, a push with the variable, the size by the INI file
    res = run("jobq-ctl", "--postgres-url", pg_url, "migrate", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    res = run("jobq-ctl", "--queue", "fleet", "push", "-c", "true", "-c", "exit 0",
              cwd=tmp_path, env={"JOBQ_POSTGRES_URL": pg_url})
    assert res.returncode == 0, res.stderr
    assert len(res.stdout.split()) == 2
    res = run("jobq-ctl", "--config", str(ini), "size", cwd=tmp_path)
    assert (res.returncode, res.stdout.strip()) == (0, "2"), res.stderr
    sup = Supervisor(tmp_path, ["--postgres-url", pg_url, "--queue", "fleet",
                                "--exit-when-empty", "--poll-interval", "0.2"])
    try:
        assert sup.wait(60) == 0, sup.log()
    finally:
        sup.stop()
    assert "backend=postgres queue=fleet" in sup.log(), sup.log()
    res = run("jobq-ctl", "--config", str(ini), "size", cwd=tmp_path)
    assert (res.returncode, res.stdout.strip()) == (0, "0"), res.stderr
    assert not (tmp_path / "jobq.db").exists()
    # the INI file alone, for the worker too
    sup = Supervisor(tmp_path, ["--config", str(ini), "--exit-when-empty"], name="ini")
    try:
        assert sup.wait(60) == 0, sup.log()
    finally:
        sup.stop()
    assert "backend=postgres queue=fleet" in sup.log(), sup.log()
    assert not (tmp_path / "jobq.db").exists()
