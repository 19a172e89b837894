"""Shared helpers: run the real commands, wait for conditions, prove nothing survived."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Callable, TypeVar

import psutil
import pytest

from supervisor.core.settings import Settings
from tests import ctl_server

T = TypeVar("T")
REPO = Path(__file__).resolve().parent.parent
BIN = ctl_server.BIN  # the venv's scripts: ctl_server forks what command("jobq-ctl") names
# Every supervisor a test starts carries this tag, and its tasks inherit it: leak checks look
# only at our own processes, not at those of another suite running on the same machine.
SESSION_TAG = uuid.uuid4().hex
# Started in the background of a non-interactive shell (`cmd &`), pytest inherits SIGINT
# ignored, and so would every jobq-ctl it starts: the Ctrl-C tests would wait in vain.  A
# handler of our own is reset to the default in each child at exec.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
# Under nohup, SIGHUP likewise: every worker would keep ignoring it (as it should under nohup)
# and the SIGHUP tests would wait in vain.  A handler that does nothing ignores it here too.
if signal.getsignal(signal.SIGHUP) is signal.SIG_IGN:
    signal.signal(signal.SIGHUP, lambda signum, frame: None)


def command(name: str) -> list[str]:
    """The installed console script, else the same entry point through this interpreter."""
    script = BIN / name
    if script.exists():
        return [str(script)]
    module, func = {"jobq-supervisor": ("supervisor.worker.main", "worker_entry"),
                    "jobq-ctl": ("supervisor.ctl.main", "ctl_entry")}[name]
    return [sys.executable, "-c", f"import sys; from {module} import {func}; "
            f"sys.exit({func}())"]


def wait_for(cond: Callable[[], object], timeout: float = 30.0, interval: float = 0.05,
             what: str = "condition") -> object:
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


@pytest.fixture
def close_at_end() -> Iterator[Callable[[T], T]]:
    """``keep(obj)`` returns ``obj`` and closes it when the test ends, in the order kept: what
    a factory fixture made."""
    kept: list = []

    def keep(obj: T) -> T:
        kept.append(obj)
        return obj

    yield keep
    for obj in kept:
        obj.close()


def term_stamp(marker: Path) -> str:
    """A shell trap: on SIGTERM, write the time (epoch seconds) to ``marker`` and exit 0.  The
    stamp goes to a temporary name first and is renamed, so whoever sees ``marker`` exist reads
    the whole stamp, never an empty file the shell has only just opened.  The trap ignores
    SIGTERM first, and so do ``date`` and ``mv`` (an ignored signal stays ignored across
    exec): the watchdog signals the process group and then each process of the tree, and that
    second SIGTERM must not kill them halfway (no stamp ever)."""
    return (f"trap 'trap \"\" TERM; date +%s.%N > {marker}.tmp && mv {marker}.tmp {marker}; "
            f"exit 0' TERM")


def processes_by_environment(wanted: Callable[[dict[str, str]], bool],
                             needle: bytes = b"JOBQ_LIFELINE=") -> list[psutil.Process]:
    """Live (non-zombie) processes whose environment is ``wanted``, among those whose
    environment holds ``needle`` at all.

    Tests poll this in wait_for loops (20 times a second) while hundreds of processes run: the
    raw /proc/PID/environ of each is searched for ``needle`` first, and only a match is parsed
    and made a psutil.Process (psutil for each: ~14 ms of CPU a call at 120 processes)."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                raw = f.read()
        except OSError:  # gone, or not ours to read
            continue
        if needle not in raw:  # a zombie's environment reads empty
            continue
        env = dict(item.split("=", 1) for item in
                   raw.decode(errors="replace").split("\0") if "=" in item)
        if not wanted(env):
            continue
        try:
            proc = psutil.Process(int(name))
            if proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def marked_processes(token_prefix: str = "") -> list[psutil.Process]:
    """Live (non-zombie) task processes (JOBQ_LIFELINE marker) of this test session."""
    return processes_by_environment(
        lambda env: env.get("JOBQ_LIFELINE", "").startswith(token_prefix)
        and "JOBQ_LIFELINE" in env and env.get("JOBQ_TEST_SESSION") == SESSION_TAG)


class Supervisor:
    """A jobq-supervisor subprocess with its log captured to a file."""

    def __init__(self, tmp: Path, args: list[str], env: dict[str, str] | None = None,
                 name: str = "sup", new_session: bool = True,
                 prefix: tuple[str, ...] = ()) -> None:
        self.log_path = tmp / f"{name}.log"
        self._log = open(self.log_path, "wb")
        full_env = dict(os.environ)
        full_env["JOBQ_TEST_SESSION"] = SESSION_TAG
        full_env.update(env or {})
        self.proc = subprocess.Popen(
            [*prefix, *command("jobq-supervisor"), *args], stdout=self._log,
            stderr=subprocess.STDOUT,
            env=full_env, cwd=tmp, start_new_session=new_session)
        self.pid = self.proc.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_log(self, text: str, timeout: float = 30.0) -> None:
        wait_for(lambda: text in self.log(), timeout, what=f"log line {text!r}\n{self.log()}")

    def signal(self, sig: int) -> None:
        os.kill(self.pid, sig)

    def wait(self, timeout: float = 60.0) -> int:
        try:
            return self.proc.wait(timeout)
        finally:
            self._log.close()

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait(10)
        self._log.close()


class Env:
    """One test's queue: a SQLite file in tmp_path plus helpers to run both commands."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.db = tmp / "jobq.db"
        self.sups: list[Supervisor] = []

    def base_args(self) -> list[str]:
        """The options both commands get to reach this test's queue."""
        return ["--sqlite-path", str(self.db)]

    def secret_env(self) -> dict[str, str]:
        """What both commands get in their environment to reach it (a connection string)."""
        return {}

    def settings(self, **kw) -> Settings:
        """The Settings a jobq-ctl with ``base_args`` has (to open the queue and its stores
        in the test, as the commands open them)."""
        return Settings(sqlite_path=str(self.db), **kw)

    def state(self, task_id: str) -> str | None:
        """The task's state as its job row says (None: no such row)."""
        return self.job(task_id).get("status")

    def ctl(self, *args: str, check: bool = True, input: str | None = None,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        full_env = dict(os.environ)
        full_env.update(self.secret_env())
        full_env.update(env or {})
        res = ctl_server.run(command("jobq-ctl") + self.base_args() + list(args), timeout=60,
                             input=input, env=full_env, cwd=self.tmp)
        if check and res.returncode != 0:
            raise AssertionError(f"jobq-ctl {args} failed: {res.stderr}")
        return res

    def push(self, *cmds: str, extra: tuple[str, ...] = ()) -> list[str]:
        args = ["push"]
        for c in cmds:
            args += ["-c", c]
        return self.ctl(*args, *extra).stdout.split()

    def serve(self, queue: str = "default") -> None:
        """Record ``queue`` as served by a worker, as a worker's start does, so that a push
        to it gives no "no worker has ever served" warning (sqlite_queues.py)."""
        from supervisor.backends.sqlite.backend import SqliteBackend

        SqliteBackend(str(self.db), queue, "test-worker", serve=True).close()

    def supervisor(self, *args: str, env: dict[str, str] | None = None,
                   name: str | None = None, base: bool = True, **kw) -> Supervisor:
        """A worker on this test's queue; ``base=False``: without ``base_args`` (a worker of
        another backend, whose options the queue's own would contradict: exit 2)."""
        sup = Supervisor(self.tmp, (self.base_args() if base else []) + list(args),
                         {**self.secret_env(), **(env or {})},
                         name or f"sup{len(self.sups)}", **kw)
        self.sups.append(sup)
        return sup

    def rows(self, sql: str = "SELECT id, status, attempt, reason FROM jobs ORDER BY seq",
             args: tuple = ()) -> list[tuple]:
        conn = sqlite3.connect(self.db, timeout=30)
        try:
            return conn.execute(sql, args).fetchall()
        finally:
            conn.close()

    def job(self, task_id: str) -> dict:
        conn = sqlite3.connect(self.db, timeout=30)
        conn.row_factory = sqlite3.Row
        try:
            row = conn.execute("SELECT * FROM jobs WHERE id=?", (task_id,)).fetchone()
            return dict(row) if row else {}
        finally:
            conn.close()

    def cleanup(self) -> None:
        for sup in self.sups:
            sup.stop()


# -- Azurite: one service of each kind per test session ---------------------------------
# Defined here and only here: a session fixture imported into several modules is a fixture
# of each of them, and each started an Azurite of its own (3-4 of a kind at once).
@pytest.fixture(scope="session")
def azurite(tmp_path_factory):
    """The session's Azurite queue service (tests.azurite.Azurite: port, pid,
    connection_string)."""
    from tests.azurite import Azurite, session_service

    with session_service("queue", tmp_path_factory) as (port, pid):
        yield Azurite(port=port, pid=pid)


@pytest.fixture(scope="session")
def azurite_table(tmp_path_factory):
    """The port of the session's Azurite table service."""
    from tests.azurite import session_service

    with session_service("table", tmp_path_factory) as (port, _pid):
        yield port


@pytest.fixture(scope="session")
def azurite_blob(tmp_path_factory):
    """The port of the session's Azurite blob service."""
    from tests.azurite import session_service

    with session_service("blob", tmp_path_factory) as (port, _pid):
        yield port


# -- PostgreSQL: one real server per test session (per xdist worker) ---------------------
# Here, not in tests/postgres/conftest.py, for the reason above: tests/postgres and the
# backend contract suite (tests/backends) share the one server.
@pytest.fixture(scope="session")
def pg_server():
    """The session's PostgreSQL server (tests.postgres.server.PgServer).  Not installed: a
    failure under CI (scripts/test installs it), else a skip that says why, on one line."""
    from tests.postgres.server import PgServer, why_no_server

    why = why_no_server()
    if why:
        if os.environ.get("CI"):  # CI must run them
            pytest.fail(f"PostgreSQL tests: {why}")
        pytest.skip(f"PostgreSQL tests: {why}")
    server = PgServer()
    try:
        server.start()
        yield server
    finally:
        server.close()


@pytest.fixture
def pg_url(pg_server) -> Iterator[str]:
    """A fresh, empty database of the session's server for this test: its libpq URI (TCP,
    password).  A test that stopped or froze the server leaves it running for the next."""
    pg_server.ensure_running()
    name = pg_server.create_database()
    yield pg_server.url(name)
    pg_server.ensure_running()
    pg_server.drop_database(name)


@pytest.fixture
def pg(tmp_path: Path, pg_url: str):
    """One test's PostgreSQL queue for the real commands (tests.postgres.env.PgEnv); no task
    process of the test may survive it.  Here, not in tests/postgres/, so that a suite of
    another folder can run its tests on PostgreSQL too."""
    from tests.postgres.env import PgEnv

    e = PgEnv(tmp_path, pg_url)
    yield e
    e.cleanup()
    survivors = wait_for_no_marked(timeout=10)
    assert not survivors, f"task processes survived the test: {survivors}"


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def fenv(request):
    """The test's queue for a fleet test that runs on both self-hosted backends: SQLite
    (``env``) or PostgreSQL (``pg``), each with its control store where ``--control auto``
    puts it."""
    return request.getfixturevalue("env" if request.param == "sqlite" else "pg")


@pytest.fixture
def sq(tmp_path: Path, azurite, queue_name: str):
    """One test's Storage Queue on the session's Azurite (tests.azure_envs.SqEnv), made (with
    its -failed twin); no task process of the test may survive it."""
    from tests.azure_envs import SqEnv

    e = SqEnv(tmp_path, azurite.port, queue_name)
    e.ctl("clear")  # creates the queues, as any first writing command does
    yield e
    e.cleanup()
    assert not wait_for_no_marked(timeout=10)


@pytest.fixture
def table(azurite_table):
    """A Table control store on Azurite, and the environment that points a worker or
    jobq-ctl at it."""
    from supervisor.fleet.control.azure_table import AzureTableControlStore
    from tests.azurite import table_connection_string

    conn = table_connection_string(azurite_table)
    store = AzureTableControlStore(connection_string=conn)
    yield store, {"JOBQ_CONTROL_CONNECTION_STRING": conn}
    store.close()


@pytest.fixture
def stores(azurite_table, azurite_blob):
    """One test's control table and output container on the session's Azurite
    (tests.azure_envs.Stores), starting from a fresh account: no control table yet."""
    from azure.core.exceptions import ResourceNotFoundError
    from azure.data.tables import TableClient
    from azure.storage.blob import ContainerClient

    from supervisor.fleet.control.azure_table import DEFAULT_TABLE
    from tests.azure_envs import Stores
    from tests.azurite import blob_connection_string, table_connection_string

    s = Stores(azurite_table, azurite_blob, "t" + uuid.uuid4().hex[:20])
    # A fresh account, where no worker made the control table yet: a read-only jobq-ctl
    # (logs -f before any worker started) must read that as no records, and wait.
    table = TableClient.from_connection_string(table_connection_string(azurite_table),
                                               DEFAULT_TABLE)
    try:
        table.delete_table()
    except ResourceNotFoundError:
        pass
    table.close()
    yield s
    raw = ContainerClient.from_connection_string(blob_connection_string(azurite_blob),
                                                 container_name=s.container)
    try:
        raw.delete_container()
    except Exception:  # noqa: BLE001 - a test that never stored anything
        pass
    raw.close()


@pytest.fixture
def queue_name() -> str:
    """A fresh queue name per test (Storage Queue rules: lowercase, digits, hyphens)."""
    return "t-" + uuid.uuid4().hex[:20]


@pytest.fixture
def env(tmp_path: Path):
    e = Env(tmp_path)
    yield e
    e.cleanup()
    # Every task process of every supervisor of this test must be gone.
    survivors = wait_for_no_marked(timeout=10)
    assert not survivors, f"task processes survived the test: {survivors}"


def wait_gone(find: Callable[[], list[psutil.Process]], timeout: float) -> list[psutil.Process]:
    """Wait up to ``timeout`` s until ``find`` finds no process; those still there are
    killed and returned (the caller's test fails on them)."""
    deadline = time.monotonic() + timeout
    while True:
        left = find()
        if not left or time.monotonic() > deadline:
            for p in left:
                try:
                    p.kill()
                except psutil.NoSuchProcess:
                    pass
            return left
        time.sleep(0.1)


def wait_for_no_marked(timeout: float) -> list[psutil.Process]:
    return wait_gone(lambda: [p for p in marked_processes() if _is_ours(p)], timeout)


def _is_ours(proc: psutil.Process) -> bool:
    """Only processes started under this test session (CI may run other suites)."""
    try:
        return proc.create_time() >= _SESSION_START - 1
    except psutil.NoSuchProcess:
        return False


_SESSION_START = time.time()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """The jobq-ctl fork server of this pytest process ends with its session."""
    ctl_server.stop()


SHUFFLE_VAR = "JOBQ_TEST_SHUFFLE"


def pytest_report_header(config: pytest.Config) -> str | None:
    seed = os.environ.get(SHUFFLE_VAR)
    return f"tests shuffled: {SHUFFLE_VAR}={seed}" if seed else None


@pytest.hookimpl(tryfirst=True)  # before the phases' own orderings (tests/reliability)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """With JOBQ_TEST_SHUFFLE=SEED: the modules in an order of that seed, and each module's
    tests too, so that every test gets other neighbours (a test that passes only after
    another is found); a module's fixtures are still made once.  The same seed in every
    pytest-xdist worker (they inherit it) gives each the same order, as xdist requires."""
    seed = os.environ.get(SHUFFLE_VAR)
    if seed:
        _shuffle(items, seed)


def _shuffle(items: list[pytest.Item], seed: str) -> None:
    import random

    rng = random.Random(seed)
    modules: dict[str, list[pytest.Item]] = {}
    for item in items:
        modules.setdefault(item.nodeid.split("::")[0], []).append(item)
    groups = list(modules.values())
    rng.shuffle(groups)
    for group in groups:
        rng.shuffle(group)
    items[:] = [item for group in groups for item in group]


PHASE_FILES_VAR = "JOBQ_TEST_PHASE_FILES"


def pytest_collection_finish(session: pytest.Session) -> None:
    """With JOBQ_TEST_PHASE_FILES=DIR (scripts/test's collection pass): DIR/PHASE lists the
    test files holding tests of each of scripts/test's phases, in collection order, so that
    a phase's workers collect those files only (each worker collects all it is given: ~3
    CPU-s for the whole suite)."""
    out = os.environ.get(PHASE_FILES_VAR)
    if not out:
        return
    phases: dict[str, dict[str, None]] = {p: {} for p in ("parallel", "timing", "stress",
                                                             "serial")}
    for item in session.items:
        marks = {m.name for m in item.iter_markers()}
        phase = next((p for p in ("serial", "stress", "timing") if p in marks), "parallel")
        phases[phase][item.nodeid.split("::")[0]] = None
    for phase, files in phases.items():
        Path(out, phase).write_text("".join(f"{f}\n" for f in files))
