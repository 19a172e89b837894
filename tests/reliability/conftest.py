"""Fixtures of the reliability suite: `env` (SQLite), `sq` (Storage Queue on the session's
Azurite) and `pg` (a database of its own on the session's PostgreSQL server), like those of
tests/conftest.py, tests/azure and tests/postgres, but the check that no task process
survived only looks at this test's own tasks: every supervisor started through them carries
JOBQ_RELIABILITY_RUN=<id> in its environment, which its tasks inherit.  (The machine may run
other suites at the same time; their tasks are none of our business.)"""

from __future__ import annotations

import signal
import time
import uuid
from pathlib import Path

import psutil
import pytest

from tests.azure_envs import SqEnv
from tests.conftest import Env, Supervisor, processes_by_environment, wait_for
from tests.postgres.env import PgEnv
from tests.postgres.faults import through

RUN_VAR = "JOBQ_RELIABILITY_RUN"

# The stress phase's schedule (scripts/test: 3 xdist workers, worksteal, which hands each
# worker consecutive tests and never takes back the one queued after a running test):
# PostgreSQL's chaos run (~60 s, the phase's longest) first and the shortest test after it,
# so that everything else runs beside it on the other two workers.  Left in file order, the
# SQLite chaos run (~20 s) waited behind it: 88 s for the phase instead of ~65.
FIRST = ("reliability/test_chaos.py::test_chaos_sigkill_supervisors[postgres]",
         "reliability/test_contention.py::test_contention_each_task_exactly_once[sqlite]")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The FIRST tests to the front, the rest in their order (collection)."""
    rank = {name: i for i, name in enumerate(FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.removeprefix("tests/"), len(rank)))


class _Scoped:
    run_id: str

    def supervisor(self, *args: str, env: dict[str, str] | None = None, **kw) -> Supervisor:
        full = {RUN_VAR: self.run_id}
        full.update(env or {})
        return super().supervisor(*args, env=full, **kw)  # type: ignore[misc]


class RelEnv(_Scoped, Env):
    def __init__(self, tmp: Path, run_id: str) -> None:
        super().__init__(tmp)
        self.run_id = run_id


class RelSqEnv(_Scoped, SqEnv):
    def __init__(self, tmp: Path, port: int, queue: str, run_id: str) -> None:
        super().__init__(tmp, port, queue)
        self.run_id = run_id


class RelPgEnv(_Scoped, PgEnv):
    """PgEnv, and the server (for its faults); a supervisor may talk to it through a
    FaultProxy's port (``via_port``), as SqEnv's may."""

    def __init__(self, tmp: Path, server, url: str, run_id: str) -> None:
        super().__init__(tmp, url)
        self.server = server
        self.run_id = run_id

    def supervisor(self, *args: str, env: dict[str, str] | None = None,
                   via_port: int | None = None, **kw) -> Supervisor:
        full = {"JOBQ_POSTGRES_URL": through(self.url, via_port)} if via_port else {}
        full.update(env or {})
        return super().supervisor(*args, env=full, **kw)


def run_processes(run_id: str) -> list[psutil.Process]:
    """Live task processes (they carry JOBQ_LIFELINE) of supervisors of this run."""
    return processes_by_environment(
        lambda env: env.get(RUN_VAR) == run_id and "JOBQ_LIFELINE" in env)


def assert_no_survivors(run_id: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while (left := run_processes(run_id)) and time.monotonic() < deadline:
        time.sleep(0.1)
    for proc in left:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass
    assert not left, f"task processes survived the test: {left}"


def still_works(env: Env, sup: Supervisor) -> None:
    """After a fault: the worker is still alive, runs a normal task, stops cleanly, and never
    logged a traceback."""
    assert sup.proc.poll() is None, f"worker exited ({sup.proc.returncode}):\n{sup.log()[-4000:]}"
    marker = env.tmp / "after"
    env.push(f"echo fine > {marker}")
    wait_for(lambda: marker.exists(), 30, what=f"a normal task afterwards\n{sup.log()[-3000:]}")
    sup.signal(signal.SIGTERM)
    assert sup.wait(30) == 0, sup.log()[-3000:]
    assert "Traceback" not in sup.log(), sup.log()[-6000:]


@pytest.fixture
def run_id() -> str:
    return uuid.uuid4().hex


@pytest.fixture
def env(tmp_path, run_id):
    e = RelEnv(tmp_path, run_id)
    yield e
    e.cleanup()
    assert_no_survivors(run_id)


@pytest.fixture
def sq(tmp_path, azurite, queue_name, run_id):
    e = RelSqEnv(tmp_path, azurite.port, queue_name, run_id)
    e.ctl("clear")  # creates the queue and its -failed twin (size no longer does)
    yield e
    e.cleanup()
    assert_no_survivors(run_id)


@pytest.fixture
def pg(tmp_path, pg_server, pg_url, run_id):
    e = RelPgEnv(tmp_path, pg_server, pg_url, run_id)
    yield e
    e.cleanup()
    assert_no_survivors(run_id)
