"""Fixtures of the reliability suite: the SQLite `env` (tests/conftest.py) and a Storage Queue
twin `sq` against the session's Azurite (tests/azure/conftest.py)."""

from __future__ import annotations

import pytest

# Re-exported so the tests here can use Azurite (pytest finds fixtures by name in conftest).
from tests.azure.conftest import azurite, queue_name  # noqa: F401
from tests.azure.test_storage_queue_worker import SqEnv
from tests.conftest import wait_for_no_marked


@pytest.fixture
def sq(tmp_path, azurite, queue_name):  # noqa: F811
    e = SqEnv(tmp_path, azurite.port, queue_name)
    e.ctl("size")  # creates the queue and its -failed twin
    yield e
    e.cleanup()
    survivors = wait_for_no_marked(timeout=10)
    assert not survivors, f"task processes survived the test: {survivors}"
