"""Azurite (Storage Queue emulator) for the tests under tests/azure.

The binary is $AZURITE_QUEUE_BIN, else <repo>/.azurite/node_modules/.bin/azurite-queue
(scripts/test installs azurite@3.35.0 there).  It listens on 127.0.0.1 only, keeps
everything in memory, runs from an empty temporary directory and is killed by its PID.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _accepts(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
        return True
    except OSError:
        return False


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
    port = free_port()
    log = open(cwd / "azurite.log", "wb")
    proc = subprocess.Popen(
        [binary, "--queueHost", "127.0.0.1", "--queuePort", str(port), "--inMemoryPersistence",
         "--skipApiVersionCheck", "--disableTelemetry", "--silent"],
        cwd=cwd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        start_new_session=True,  # its own group: node's children die with it
    )
    try:
        deadline = time.monotonic() + 30
        while not _accepts(port):
            if proc.poll() is not None:
                raise RuntimeError(f"Azurite exited with {proc.returncode}; see {cwd}/azurite.log")
            if time.monotonic() > deadline:
                raise RuntimeError(f"Azurite did not listen on {port} within 30 s")
            time.sleep(0.1)
        yield Azurite(port=port, pid=proc.pid)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGTERM)  # group id == pid (new session)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=5)
        log.close()


@pytest.fixture
def queue_name() -> str:
    """A fresh queue name per test (Storage Queue rules: lowercase, digits, hyphens)."""
    return "t-" + uuid.uuid4().hex[:20]
