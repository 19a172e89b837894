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
from pathlib import Path

START_WITHIN = 30.0


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
