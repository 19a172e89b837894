"""Tests of the PostgreSQL backend against a real server (tests/postgres/server.py).

The fixtures ``pg_server`` (one server per session, i.e. per xdist worker), ``pg_url`` (a
fresh database per test) and ``pg`` (PgEnv on it) live in tests/conftest.py, so that the
backend contract suite and the fleet suites share the same server; every module here carries
the ``postgres`` marker.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.conftest import wait_for_no_marked
from tests.postgres.env import PgEnv


def pytest_collection_modifyitems(config, items) -> None:
    """Every test under tests/postgres is marked ``postgres`` (``-m postgres`` picks them)."""
    here = __file__.rsplit("/", 1)[0] + "/"
    for item in items:
        if str(item.fspath).startswith(here):
            item.add_marker(pytest.mark.postgres)


@pytest.fixture(scope="session")
def pg_bouncer(pg_server):
    """The session's PgBouncer in transaction pooling mode in front of ``pg_server``
    (tests.postgres.bouncer.PgBouncer).  Not installed: a failure under CI (scripts/test
    installs it), else a skip that says why, on one line."""
    from tests.postgres.bouncer import PgBouncer, why_no_bouncer

    why = why_no_bouncer()
    if why:
        if os.environ.get("CI"):  # CI must run them
            pytest.fail(f"PgBouncer tests: {why}")
        pytest.skip(f"PgBouncer tests: {why}")
    bouncer = PgBouncer(pg_server)
    try:
        bouncer.start()
        yield bouncer
    finally:
        bouncer.close()


@pytest.fixture
def bouncer_url(pg_bouncer, pg_url: str) -> str:
    """The URL of this test's fresh database (``pg_url``) through the session's PgBouncer,
    its server connections open."""
    dbname = pg_url.rsplit("/", 1)[1]
    pg_bouncer.warm(dbname)
    return pg_bouncer.url(dbname)


@pytest.fixture
def pgb(tmp_path: Path, bouncer_url: str):
    """``pg`` through PgBouncer in transaction mode: every command of the test's queue gets
    ``--postgres-notify off`` and reaches the database through the bouncer."""
    e = PgEnv(tmp_path, bouncer_url, notify="off")
    yield e
    e.cleanup()
    survivors = wait_for_no_marked(timeout=10)
    assert not survivors, f"task processes survived the test: {survivors}"
