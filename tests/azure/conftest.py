"""Azurite (Storage Queue emulator) for the tests under tests/azure.

The binary is $AZURITE_QUEUE_BIN, else <repo>/.azurite/node_modules/.bin/azurite-queue
(scripts/test installs azurite@3.35.0 there).  It listens on 127.0.0.1 only, keeps
everything in memory, runs from an empty temporary directory and is killed by its PID.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

import pytest

from tests.azurite import (  # noqa: F401 (re-exported)
    ACCOUNT,
    ACCOUNT_KEY,
    azurite_service,
    free_port,
    session_service,
)


@dataclass
class Azurite:
    port: int
    pid: int

    @property
    def connection_string(self) -> str:
        return (f"DefaultEndpointsProtocol=http;AccountName={ACCOUNT};AccountKey={ACCOUNT_KEY};"
                f"QueueEndpoint=http://127.0.0.1:{self.port}/{ACCOUNT}")


@pytest.fixture(scope="session")
def azurite(tmp_path_factory):
    with session_service("queue", tmp_path_factory) as (port, pid):
        yield Azurite(port=port, pid=pid)


@pytest.fixture
def queue_name() -> str:
    """A fresh queue name per test (Storage Queue rules: lowercase, digits, hyphens)."""
    return "t-" + uuid.uuid4().hex[:20]
