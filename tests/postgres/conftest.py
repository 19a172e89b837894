"""Tests of the PostgreSQL backend against a real server (tests/postgres/server.py).

The fixtures ``pg_server`` (one server per session, i.e. per xdist worker) and ``pg_url`` (a
fresh database per test) live in tests/conftest.py, so that the backend contract suite shares
the same server; every module here carries the ``postgres`` marker.
"""

from __future__ import annotations

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


@pytest.fixture
def pg(tmp_path: Path, pg_url: str):
    """One test's PostgreSQL queue for the real commands (PgEnv); no task process of the
    test may survive it."""
    e = PgEnv(tmp_path, pg_url)
    yield e
    e.cleanup()
    survivors = wait_for_no_marked(timeout=10)
    assert not survivors, f"task processes survived the test: {survivors}"
