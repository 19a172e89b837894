"""One Azurite service (queue, table or blob) on a free loopback port, for test fixtures.

Azurite 3.35.0 (npm, installed by scripts/test into <repo>/.azurite) keeps everything in
memory, runs from an empty directory (it writes its debug files there) and is killed by its
process group (it runs in a session of its own, so node's children die with it).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

START_WITHIN = 30.0
REPO = Path(__file__).resolve().parents[1]
# The emulator's well-known development account (public, documented by Microsoft).
ACCOUNT = "devstoreaccount1"
ACCOUNT_KEY = (
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
)


@dataclass
class Azurite:
    """The session's Azurite queue service."""

    port: int
    pid: int

    @property
    def connection_string(self) -> str:
        return queue_connection_string(self.port)


def table_connection_string(port: int) -> str:
    return (f"DefaultEndpointsProtocol=http;AccountName={ACCOUNT};AccountKey={ACCOUNT_KEY};"
            f"TableEndpoint=http://127.0.0.1:{port}/{ACCOUNT}")


def blob_connection_string(port: int, key: str = ACCOUNT_KEY) -> str:
    return (f"DefaultEndpointsProtocol=http;AccountName={ACCOUNT};AccountKey={key};"
            f"BlobEndpoint=http://127.0.0.1:{port}/{ACCOUNT}")


NPM_DONE_VAR = "JOBQ_TEST_NPM_DONE"
NPM_WAIT = 300.0  # s: scripts/test's npm install of Azurite, from a fresh clone


def _await_install() -> None:
    """Wait for scripts/test's npm install of Azurite, which runs beside the first tests: it
    writes npm's exit status to $JOBQ_TEST_NPM_DONE when done.  A failed install fails the
    test that needs Azurite (as it failed the run before)."""
    import pytest

    done = os.environ.get(NPM_DONE_VAR)
    if not done:
        return
    deadline = time.monotonic() + NPM_WAIT
    while not os.path.exists(done):
        if time.monotonic() > deadline:
            pytest.fail(f"npm install of Azurite still running after {NPM_WAIT:g}s")
        time.sleep(0.2)
    status = Path(done).read_text().strip()
    if status != "0":
        pytest.fail(f"npm install of Azurite failed (exit status {status}; scripts/test's log)")


def service_binary(service: str) -> str | None:
    """``azurite-<service>``: $AZURITE_<SERVICE>_BIN, else beside $AZURITE_QUEUE_BIN, else in
    <repo>/.azurite (where scripts/test installs it); None when not installed.  Waits for
    scripts/test's install first."""
    _await_install()
    env = os.environ.get(f"AZURITE_{service.upper()}_BIN")
    if env:
        return env
    queue_bin = os.environ.get("AZURITE_QUEUE_BIN")
    candidates = [Path(queue_bin).parent / f"azurite-{service}"] if queue_bin else []
    candidates.append(REPO / ".azurite" / "node_modules" / ".bin" / f"azurite-{service}")
    for path in candidates:
        if path.exists():
            return str(path)
    return None


@contextmanager
def session_service(service: str, tmp_path_factory) -> Iterator[tuple[int, int]]:
    """A session fixture's Azurite ``service``: (port, pid).  Not installed: a failure under
    CI (scripts/test installs it), else a skip that says how to get it."""
    import pytest

    binary = service_binary(service)
    if binary is None:
        if os.environ.get("CI"):
            pytest.fail("Azurite is not installed; scripts/test installs it")
        pytest.skip(f"azurite-{service} not found: set AZURITE_QUEUE_BIN or run `npm install "
                    "azurite@3.35.0` in <repo>/.azurite (scripts/test does)")
    cwd = tmp_path_factory.mktemp(f"azurite-{service}")  # empty: Azurite writes files here
    with azurite_service(binary, service, cwd) as found:
        yield found


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def accepts(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
        return True
    except OSError:
        return False


@contextmanager
def azurite_service(binary: str, service: str, cwd: Path) -> Iterator[tuple[int, int]]:
    """Run ``azurite-<service>`` until the block ends; yields (port, pid)."""
    port = free_port()
    log = open(cwd / "azurite.log", "wb")
    proc = subprocess.Popen(
        [binary, f"--{service}Host", "127.0.0.1", f"--{service}Port", str(port),
         "--inMemoryPersistence", "--skipApiVersionCheck", "--disableTelemetry", "--silent"],
        cwd=cwd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        start_new_session=True)
    try:
        deadline = time.monotonic() + START_WITHIN
        while not accepts(port):
            if proc.poll() is not None:
                raise RuntimeError(f"azurite-{service} exited with {proc.returncode}; "
                                   f"see {cwd}/azurite.log")
            if time.monotonic() > deadline:
                raise RuntimeError(f"azurite-{service} did not listen on {port} within "
                                   f"{START_WITHIN:g} s")
            time.sleep(0.1)
        yield port, proc.pid
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


def queue_connection_string(port: int, key: str = ACCOUNT_KEY) -> str:
    return (f"DefaultEndpointsProtocol=http;AccountName={ACCOUNT};AccountKey={key};"
            f"QueueEndpoint=http://127.0.0.1:{port}/{ACCOUNT}")
