"""Pytest fixtures for the in-process Service Bus test broker.

The fixture runs on the test thread; the broker runs on its own thread (see broker.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests import ctl_server
from tests.conftest import Env, Supervisor, command, marked_processes, wait_gone

from .broker import ServiceBusTestBroker


@pytest.fixture
def sb_broker() -> Iterator[ServiceBusTestBroker]:
    """A started broker on a free 127.0.0.1 port; stopped (thread joined, sockets closed) after.

    Default queue settings: lock duration 60 s, max delivery count 10, queues auto-created on
    first use. Use ``sb_broker.create_queue(name, lock_duration=..., max_delivery_count=...)``
    to configure a queue before the SDK touches it.
    """
    broker = ServiceBusTestBroker().start()
    try:
        yield broker
    finally:
        broker.stop()
    leftover = [t.name for t in threading.enumerate() if t.name.startswith("sb-test-broker")]
    assert not leftover, f"broker threads left behind: {leftover}"
    assert not broker.errors, f"errors inside the test broker: {broker.errors!r}"


# -- the jobq-supervisor commands against the broker ----------------------------------------

SECRET_KEY = "c2VjcmV0LWtleS1mb3ItdGhlLXRlc3RzLW9ubHk9PQ=="  # any key works with the broker


def connection_string(port: int) -> str:
    """The test broker's connection string (the SDK's development-emulator form)."""
    return (f"Endpoint=sb://127.0.0.1:{port};SharedAccessKeyName=test;"
            f"SharedAccessKey={SECRET_KEY};UseDevelopmentEmulator=true")


def work_backend(sb_broker: ServiceBusTestBroker, receivers: int, queue: str = "work",
                 lock: float = 5, worker_id: str = "w1") -> Any:
    """A ServiceBusBackend on queue ``queue`` (made with a ``lock`` s lock when new; default:
    "work", 5 s) for the backend tests."""
    from supervisor.backends.servicebus.backend import ServiceBusBackend

    sb_broker.create_queue(queue, lock_duration=lock)
    return ServiceBusBackend(queue, connection_string=connection_string(sb_broker.port),
                             worker_id=worker_id, lock_duration=lock, receivers=receivers,
                             receive_wait=0.5)


def close_backend(*backends: Any) -> None:
    """Close ServiceBusBackends, then wait for their opener threads: an open under way at
    close is not waited for (the exit's budget); it ends on its own, within 20 s."""
    for backend in backends:
        backend.close()
    deadline = time.monotonic() + 20
    while [t for t in threading.enumerate() if t.name == "sb-opener" and t.is_alive()]:
        assert time.monotonic() < deadline, "the opener thread outlived the backend by 20 s"
        time.sleep(0.05)


class SbEnv(Env):
    """One test's Service Bus queue on the broker, plus both commands configured for it.

    The connection string reaches the commands through JOBQ_CONNECTION_STRING, as a user
    should pass it; its key is long enough to be scrubbed, and no log may contain it."""

    def __init__(self, tmp: Path, broker: ServiceBusTestBroker, queue: str = "work") -> None:
        super().__init__(tmp)
        self.broker = broker
        self.queue = queue
        self.token = uuid.uuid4().hex  # in every task's environment: tells our tasks apart
        self.connection_string = (f"Endpoint=sb://127.0.0.1:{broker.port};"
                                  f"SharedAccessKeyName=test;SharedAccessKey={SECRET_KEY};"
                                  "UseDevelopmentEmulator=true")

    def base_args(self) -> list[str]:
        return ["--backend", "servicebus", "--queue", self.queue, "--poll-interval", "0.2"]

    def _env(self, env: dict[str, str] | None) -> dict[str, str]:
        return {"JOBQ_CONNECTION_STRING": self.connection_string, "SB_TEST_MARK": self.token,
                **(env or {})}

    def tasks(self) -> list[psutil.Process]:
        """Live task processes of this test's supervisors (other suites may run meanwhile)."""
        found = []
        for proc in marked_processes():
            try:
                if proc.environ().get("SB_TEST_MARK") == self.token:
                    found.append(proc)
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                pass
        return found

    def wait_no_tasks(self, timeout: float) -> list[psutil.Process]:
        return wait_gone(self.tasks, timeout)

    def ctl(self, *args: str, check: bool = True, input: str | None = None,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        full_env = dict(os.environ)
        full_env.update(self._env(env))
        res = ctl_server.run(command("jobq-ctl") + ["--backend", "servicebus", "--queue",
                                                    self.queue, *args],
                             timeout=60, input=input, env=full_env, cwd=self.tmp)
        assert SECRET_KEY not in res.stdout + res.stderr
        if check and res.returncode != 0:
            raise AssertionError(f"jobq-ctl {args} failed: {res.stderr}")
        return res

    def supervisor(self, *args: str, env: dict[str, str] | None = None,
                   name: str | None = None, **kw) -> Supervisor:
        return super().supervisor(*args, env=self._env(env), name=name, **kw)

    def failed_json(self) -> list[dict]:
        return json.loads(self.ctl("failed", "--json").stdout)


@pytest.fixture
def sb_env(tmp_path: Path, sb_broker: ServiceBusTestBroker) -> Iterator[SbEnv]:
    e = SbEnv(tmp_path, sb_broker)
    yield e
    e.cleanup()
    survivors = e.wait_no_tasks(timeout=10)
    assert not survivors, f"task processes survived the test: {survivors}"
    for sup in e.sups:
        assert SECRET_KEY not in sup.log(), f"the key leaked into {sup.log_path}"
