"""Tests of the PostgreSQL backend against a real server (tests/postgres/server.py).

The fixtures ``pg_server`` (one server per session, i.e. per xdist worker), ``pg_url`` (a
fresh database per test) and ``pg`` (PgEnv on it) live in tests/conftest.py, so that the
backend contract suite and the fleet suites share the same server; every module here carries
the ``postgres`` marker.
"""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(config, items) -> None:
    """Every test under tests/postgres is marked ``postgres`` (``-m postgres`` picks them)."""
    here = __file__.rsplit("/", 1)[0] + "/"
    for item in items:
        if str(item.fspath).startswith(here):
            item.add_marker(pytest.mark.postgres)
