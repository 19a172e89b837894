"""Azurite (Storage Queue emulator) for the tests under tests/azure.

The binary is $AZURITE_QUEUE_BIN, else <repo>/.azurite/node_modules/.bin/azurite-queue
(scripts/test installs azurite@3.35.0 there).  It listens on 127.0.0.1 only, keeps
everything in memory, runs from an empty temporary directory and is killed by its PID.
"""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.azurite import azurite_service, free_port  # noqa: F401 (re-exported)

REPO = Path(__file__).resolve().parents[2]
# The emulator's well-known development account (public, documented by Microsoft).
ACCOUNT = "devstoreaccount1"
ACCOUNT_KEY = (
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
)


@dataclass
class Azurite:
    port: int
    pid: int

    @property
    def connection_string(self) -> str:
        return (f"DefaultEndpointsProtocol=http;AccountName={ACCOUNT};AccountKey={ACCOUNT_KEY};"
                f"QueueEndpoint=http://127.0.0.1:{self.port}/{ACCOUNT}")


def _azurite_bin() -> str | None:
    env = os.environ.get("AZURITE_QUEUE_BIN")
    if env:
        return env
    local = REPO / ".azurite" / "node_modules" / ".bin" / "azurite-queue"
    return str(local) if local.exists() else None


@pytest.fixture(scope="session")
def azurite(tmp_path_factory):
    binary = _azurite_bin()
    if binary is None:
        if os.environ.get("CI"):
            pytest.fail("Azurite is not installed; scripts/test installs it")
        pytest.skip("Azurite not installed: set AZURITE_QUEUE_BIN or run "
                    "`npm install azurite@3.35.0` in <repo>/.azurite (scripts/test does)")
    cwd = tmp_path_factory.mktemp("azurite")  # empty: Azurite writes its debug/state files here
    with azurite_service(binary, "queue", cwd) as (port, pid):
        yield Azurite(port=port, pid=pid)


@pytest.fixture
def queue_name() -> str:
    """A fresh queue name per test (Storage Queue rules: lowercase, digits, hyphens)."""
    return "t-" + uuid.uuid4().hex[:20]
