"""The measurements behind the bench's figures and their references (bench's main thread).

Each starts what it measures in the bench's scratch directory and returns raw numbers;
``bench.py`` turns them into rows.  Every supervisor is stopped however a measurement ends.
"""

from __future__ import annotations

import signal
import sqlite3
import subprocess
import sys
import threading
import time
from functools import partial
from pathlib import Path
from typing import Callable

import psutil
from benchlib import (
    REPO,
    BenchError,
    all_dead,
    expect_exit,
    first,
    json_log,
    run_span,
    stop,
    supervisor,
    ts,
    wait_until,
)

sys.path.insert(0, str(REPO))

from supervisor.backends.base import Backend, BackendError  # noqa: E402
from supervisor.backends.sqlite.backend import SqliteBackend  # noqa: E402
from supervisor.core.task import Task  # noqa: E402

TERM_RECORDER = r'''
import os, signal, sys, time
out = sys.argv[1]
def on_term(signum, frame):
    t = time.time()
    with open(out, "a") as fh:
        fh.write(f"{t}\n")
    os._exit(0)
signal.signal(signal.SIGTERM, on_term)
with open(out + ".ready", "a") as fh:
    fh.write("1\n")
while True:
    signal.pause()
'''

# A jobq-supervisor whose SQLite control store appends "<monotonic time> <method>" to the file
# named by its first argument for every call (control_calls).  CLOCK_MONOTONIC is the same
# clock in every process, so the bench can compare the times with its own.
COUNTING_WORKER = r'''
import sys, time
from supervisor.worker.main import worker_main
from supervisor.fleet.control.sqlite import SqliteControlStore
out = open(sys.argv.pop(1), "a", buffering=1)
def counted(name, method):
    def call(*args, **kwargs):
        out.write(f"{time.monotonic()} {name}\n")
        return method(*args, **kwargs)
    return call
for name, method in list(vars(SqliteControlStore).items()):
    if callable(method) and not name.startswith("_") and name != "close":
        setattr(SqliteControlStore, name, counted(name, method))
sys.exit(worker_main())
'''


def fresh_sqlite(db: Path, tasks: list[Task]) -> list[str]:
    """A new queue file at ``db`` holding ``tasks``; their ids."""
    if db.exists():
        db.unlink()
    backend = SqliteBackend(str(db), "default", "bench")
    try:
        return backend.push(tasks)
    finally:
        backend.close()


def in_threads(work: Callable[[], None], threads: int) -> float:
    """Run ``work`` on ``threads`` threads at once; seconds until the last one returns."""
    t0 = time.perf_counter()
    pool = [threading.Thread(target=work) for _ in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    return time.perf_counter() - t0


def has_text(path: Path) -> bool:
    return path.exists() and bool(path.read_text().strip())


def task_procs(ps: psutil.Process, name: str) -> list[psutil.Process]:
    return [c for c in ps.children(recursive=True) if c.name() == name]


def shell_and_sleeps(ps: psutil.Process) -> list[psutil.Process]:
    """The task processes under a supervisor: shells and sleeps."""
    return [c for c in ps.children(recursive=True) if c.name() in ("sleep", "bash")]


LOCK_LOSS_TASK = "sleep 600 & sleep 600; true"


def lock_loss_victims(proc: subprocess.Popen[bytes]) -> list[psutil.Process]:
    """LOCK_LOSS_TASK's processes once both sleeps run, 1.5 s later (renewals under way)."""
    ps = psutil.Process(proc.pid)
    wait_until(lambda: len(task_procs(ps, "sleep")) == 2, 30, what="the task's 2 sleeps")
    victims = shell_and_sleeps(ps)
    time.sleep(1.5)
    return victims


# --------------------------------------------------------------------------- references
def raw_spawn_rate(n: int, threads: int = 4) -> float:
    """`bash -c true` spawned and reaped from `threads` threads: tasks/s."""
    left = [n]
    lock = threading.Lock()

    def work() -> None:
        while True:
            with lock:
                if left[0] <= 0:
                    return
                left[0] -= 1
            subprocess.Popen(["/bin/bash", "-c", "true"]).wait()

    return n / in_threads(work, threads)


def raw_azurite_rate(conn_str: str, queue: str, n: int, threads: int = 4) -> float:
    """Receive+delete of n messages with the same SDK from `threads` threads: messages/s."""
    from azure.storage.queue import QueueClient

    qc = QueueClient.from_connection_string(conn_str, queue)
    qc.create_queue()
    for i in range(n):
        qc.send_message(f"m{i}")
    done = [0]
    lock = threading.Lock()

    def work() -> None:
        client = QueueClient.from_connection_string(conn_str, queue)
        while True:
            msgs = list(client.receive_messages(max_messages=1, visibility_timeout=60))
            if not msgs:
                return
            for m in msgs:
                client.delete_message(m)
                with lock:
                    done[0] += 1

    seconds = in_threads(work, threads)
    return done[0] / seconds


# --------------------------------------------------------------------------- measurements
def sqlite_throughput(tmp: Path, n: int, extra: tuple[str, ...] = (),
                      env: dict[str, str] | None = None) -> float:
    db = tmp / "tp.db"
    fresh_sqlite(db, [Task(cmd="true") for _ in range(n)])
    with supervisor(["--sqlite-path", str(db), "-n", "4", "--exit-when-empty",
                     "--log-format", "json", "--poll-interval", "0.05", *extra], tmp,
                    env=env, log="tp.log") as proc:
        expect_exit(proc, 600, tmp / "tp.log")
    return n / run_span(tmp / "tp.log")


def push_with_retry(backend: Backend, tasks: list[Task], tries: int = 5) -> None:
    """Azurite under load sometimes resets a connection; push what is left again."""
    left = list(tasks)
    for attempt in range(tries):
        try:
            while left:
                backend.push(left[:1])
                left.pop(0)
            return
        except BackendError:
            if attempt == tries - 1:
                raise
            time.sleep(0.5)


def azurite_throughput(tmp: Path, conn_str: str, queue: str, n: int) -> float:
    from supervisor.backends.storage_queue.backend import StorageQueueBackend

    backend = StorageQueueBackend(queue, connection_string=conn_str, worker_id="bench")
    push_with_retry(backend, [Task(cmd="true") for _ in range(n)])
    backend.close()
    with supervisor(["--backend", "storage-queue", "--queue", queue, "-n", "4",
                     "--exit-when-empty", "--log-format", "json", "--poll-interval", "0.05"],
                    tmp, env={"JOBQ_CONNECTION_STRING": conn_str}, log="az.log") as proc:
        expect_exit(proc, 600, tmp / "az.log")
    return n / run_span(tmp / "az.log")


def dispatch_latency(tmp: Path, samples: int, run: int) -> list[float]:
    """push -> process start with an idle worker at its default settings."""
    db = tmp / f"lat{run}.db"
    with supervisor(["--sqlite-path", str(db)], tmp, log="lat.log", stop_timeout=30):
        wait_until(db.exists, 10, what="the supervisor to create its database")
        backend = SqliteBackend(str(db), "default", "bench", busy_timeout=30)
        try:
            out = []
            for i in range(samples):
                mark = tmp / f"lat{run}-{i}"
                time.sleep(0.37)  # land at a random phase of the poll cycle
                t0 = time.time()
                backend.push([Task(cmd=f"date +%s.%N > {mark}")])
                wait_until(partial(has_text, mark), 10, what=f"task {i} to start")
                out.append(float(mark.read_text()) - t0)
            return out
        finally:
            backend.close()


def overhead(tmp: Path, tasks: int, window: float, windows: int,
             extra: tuple[str, ...] = ()) -> tuple[list[float], float]:
    """Supervisor CPU-s/s in each of `windows` windows, and RSS (MiB), while `tasks` sleep
    tasks run, measured in the steady state: every task started and, with the short lease,
    every lease thread running (they start halfway to their first renewal).  ``extra``:
    more supervisor options."""
    db = tmp / f"ov{tasks}.db"
    fresh_sqlite(db, [Task(cmd="sleep 600") for _ in range(tasks)])
    args = ["--sqlite-path", str(db), "-n", str(tasks), "--kill-timeout", "5", *extra]
    if tasks >= 1000:
        # A short lease so that renewals happen in the window: 100 renewals/s.
        args += ["--lock-duration", "30", "--renew-interval", "10"]
    with supervisor(args, tmp, log=f"ov{tasks}.log", stop_timeout=120) as proc:
        ps = psutil.Process(proc.pid)
        conn = sqlite3.connect(db, timeout=30)
        try:
            wait_until(lambda: conn.execute("SELECT COUNT(*) FROM jobs WHERE status='running'")
                       .fetchone()[0] == tasks, 300, 0.2, what=f"{tasks} leases")
        finally:
            conn.close()
        # Rows are leased at once; the processes start over the next seconds.
        wait_until(lambda: len(task_procs(ps, "sleep")) == tasks, 300, 0.2,
                   what=f"{tasks} sleep processes")
        if tasks >= 1000:
            wait_until(lambda: ps.num_threads() >= tasks, 60, 0.2, what="every lease thread")
        time.sleep(2.0)  # let start-up work settle
        cpus = []
        for _ in range(windows):
            c0 = sum(ps.cpu_times()[:2])
            time.sleep(window)
            cpus.append((sum(ps.cpu_times()[:2]) - c0) / window)
        rss = ps.memory_info().rss / 2**20
        return cpus, rss


def control_calls(tmp: Path, window: float) -> list[tuple[float, str]]:
    """The control store calls of one idle SQLite worker at its default intervals, as
    (seconds into the window, method), over ``window`` seconds from its second heartbeat
    (the steady state).  The worker is the real one, its store's methods wrapped to log each
    call (COUNTING_WORKER): nothing in the supervisor is changed for the count."""
    db, calls, script = tmp / "cc.db", tmp / "cc.calls", tmp / "cc.py"
    for p in (db, calls):
        if p.exists():
            p.unlink()
    script.write_text(COUNTING_WORKER)

    def logged() -> list[tuple[float, str]]:
        if not calls.exists():
            return []
        return [(float(t), name) for t, name in
                (line.split() for line in calls.read_text().splitlines() if line.strip())]

    def beats() -> list[float]:
        return [t for t, name in logged() if name == "put_worker"]

    with supervisor(["--sqlite-path", str(db)], tmp, log="cc.log",
                    prog=[sys.executable, str(script), str(calls)]):
        wait_until(lambda: len(beats()) >= 2, 120, 0.05,
                   what="the idle worker's second heartbeat")
        t0 = beats()[1]
        time.sleep(max(0.0, t0 + window + 0.5 - time.monotonic()))
        got = logged()
    return [(t - t0, name) for t, name in got if t0 <= t < t0 + window]


def sigterm_forwarding(tmp: Path, tasks: int) -> list[float]:
    rec = tmp / "rec.py"
    rec.write_text(TERM_RECORDER)
    outs = [tmp / f"fw{i}" for i in range(tasks)]
    for o in outs:
        for p in (o, Path(str(o) + ".ready")):
            if p.exists():
                p.unlink()
    db = tmp / "fw.db"
    fresh_sqlite(db, [Task(cmd=f"exec {sys.executable} {rec} {o}") for o in outs])
    with supervisor(["--sqlite-path", str(db), "-n", str(tasks)], tmp, log="fw.log") as proc:
        wait_until(lambda: all(Path(str(o) + ".ready").exists() for o in outs), 120, 0.05,
                   what=f"{tasks} tasks ready")
        time.sleep(0.5)
        t0 = time.time()
        stop(proc, 60)
    missed = [o.name for o in outs if not o.exists()]
    if missed:
        raise BenchError(f"SIGTERM never reached {missed}")
    return [float(o.read_text().split()[0]) - t0 for o in outs]


def escalation_lateness(tmp: Path, kill_timeout: float = 1.0) -> float:
    db = tmp / "esc.db"
    fresh_sqlite(db, [Task(cmd="trap '' TERM; sleep 600; true")])
    with supervisor(["--sqlite-path", str(db), "--kill-timeout", str(kill_timeout)], tmp,
                    log="esc.log") as proc:
        ps = psutil.Process(proc.pid)
        wait_until(lambda: task_procs(ps, "sleep"), 30, what="the task's sleep")
        victims = shell_and_sleeps(ps)
        t0 = time.time()
        proc.send_signal(signal.SIGTERM)
        wait_until(lambda: all_dead(victims), kill_timeout + 30, 0.002,
                   what="the task to be killed")
        dead = time.time()
        proc.wait(60)  # the stop under way: a second SIGTERM would kill at once
    return dead - (t0 + kill_timeout)


def sqlite_lock_loss(tmp: Path) -> tuple[float, float]:
    """(seconds from the logged lock loss to the group's death, margin before LockedUntil)."""
    db = tmp / "ll.db"
    [tid] = fresh_sqlite(db, [Task(cmd=LOCK_LOSS_TASK)])
    log = tmp / "ll.log"
    with supervisor(["--sqlite-path", str(db), "--lock-duration", "6", "--renew-interval", "1",
                     "--log-format", "json"], tmp, log=log.name) as proc:
        victims = lock_loss_victims(proc)
        conn = sqlite3.connect(db, timeout=30, isolation_level=None)
        try:
            conn.execute("BEGIN EXCLUSIVE")
            locked_until = conn.execute("SELECT locked_until FROM jobs WHERE id=?",
                                        (tid,)).fetchone()[0]
            wait_until(lambda: all_dead(victims), 20, 0.002, what="the task to be killed")
            dead = time.time()
            conn.execute("ROLLBACK")
        finally:
            conn.close()
    lost = first(json_log(log), "lock lost", log)
    return dead - ts(lost), locked_until - dead


def azurite_lock_loss(tmp: Path, conn_str: str, port: int, queue: str) -> float:
    """Margin between the task group's death and the message becoming visible again."""
    from azure.storage.queue import QueueClient

    from supervisor.backends.storage_queue.backend import StorageQueueBackend
    from tests.faults.proxy import FaultProxy

    backend = StorageQueueBackend(queue, connection_string=conn_str, worker_id="bench")
    backend.push([Task(cmd=LOCK_LOSS_TASK)])
    backend.close()
    with FaultProxy(("127.0.0.1", port)) as proxy:
        via = conn_str.replace(f":{port}/", f":{proxy.address[1]}/")
        with supervisor(["--backend", "storage-queue", "--queue", queue,
                         "--visibility-timeout", "6", "--renew-interval", "1"], tmp,
                        env={"JOBQ_CONNECTION_STRING": via}, log="azll.log") as proc:
            victims = lock_loss_victims(proc)
            proxy.blackhole()
            wait_until(lambda: all_dead(victims), 20, 0.002, what="the task to be killed")
            dead = time.time()
            qc = QueueClient.from_connection_string(conn_str, queue)
            wait_until(lambda: list(qc.peek_messages()), 30, 0.02,
                       what="the message to be visible again")
            visible = time.time()
            proxy.restore()
    return visible - dead
