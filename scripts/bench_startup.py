"""Start-up figure of ``scripts/bench``: exec -> first task start and exec -> exit on an empty
queue, per backend, next to the interpreter's own start and the Storage Queue SDK's import.

Each time is a median over ``runs`` runs of the real ``jobq-supervisor`` console script with
``--exit-when-empty``.  The first task is ``date +%s.%N > stamp``: its wall-clock stamp minus
the wall-clock time just before the exec.  Storage Queue runs against an Azurite of its own
(queue, table, blob: the control store is on, as by default) behind counting proxies
(bench_calls.py), which also list the calls a worker makes before its first receive; Service
Bus against the project's AMQP test broker (tests/servicebus), in this process, on a thread.
Runs on the bench's main thread.

The package is byte-compiled first, as pip does at install: an editable checkout run with
PYTHONDONTWRITEBYTECODE (set on this project's VM) compiles every supervisor module from source
at each start, 0.1-0.3 s that no installed worker pays and the SDK (installed, compiled) never
pays in the reference.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

from bench_calls import CountedAzurite
from benchlib import BIN, REPO, Bench, BenchError, byte_compile, log_tail

RUNS = 5


def _median_exec(cmd: list[str], runs: int) -> float:
    times = []
    for _ in range(runs):
        t0 = time.monotonic()
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        times.append(time.monotonic() - t0)
    return statistics.median(times)


def references(runs: int) -> dict[str, float]:
    """``python3 -c pass`` and ``python3 -c "import azure.storage.queue"`` (this
    interpreter: the one the console scripts run), median seconds."""
    py = sys.executable
    return {"python_pass_s": _median_exec([py, "-c", "pass"], runs),
            "import_storage_queue_s": _median_exec([py, "-c", "import azure.storage.queue"],
                                                   runs)}


def _worker(args: list[str], env: dict[str, str], cwd: Path, log: Path,
            control: str) -> tuple[float, float]:
    """Run one worker to its exit: (exec wall-clock time, seconds exec -> exit)."""
    cmd = [str(BIN / "jobq-supervisor"), *args, "--exit-when-empty", "--control", control]
    with open(log, "wb") as out:
        wall, t0 = time.time(), time.monotonic()
        proc = subprocess.run(cmd, env={**os.environ, **env}, cwd=cwd, stdout=out,
                              stderr=subprocess.STDOUT, timeout=120)
        took = time.monotonic() - t0
    if proc.returncode != 0:
        raise BenchError(f"supervisor exited {proc.returncode}:\n{log_tail(log)}")
    return wall, took


def measure_backend(push: Callable[[str], None], args: list[str], env: dict[str, str],
                    tmp: Path, runs: int, control: str = "auto") -> dict[str, float]:
    """Median seconds exec -> first task start and exec -> exit on an empty queue."""
    first, empty = [], []
    for i in range(runs):
        stamp = tmp / f"stamp{i}"
        push(f"date +%s.%N > {stamp}")
        wall, _ = _worker(args, env, tmp, tmp / f"first{i}.log", control)
        if not stamp.exists():
            raise BenchError(f"the task never ran:\n{log_tail(tmp / f'first{i}.log')}")
        first.append(float(stamp.read_text()) - wall)
        empty.append(_worker(args, env, tmp, tmp / f"empty{i}.log", control)[1])
    return {"first_task_s": statistics.median(first), "exit_empty_s": statistics.median(empty),
            "first_task_runs_s": first, "exit_empty_runs_s": empty}  # type: ignore[dict-item]


def _ctl(args: list[str], env: dict[str, str], cwd: Path) -> None:
    subprocess.run([str(BIN / "jobq-ctl"), *args], env={**os.environ, **env}, cwd=cwd,
                   check=True, stdout=subprocess.DEVNULL, timeout=60)


def sqlite_startup(tmp: Path, runs: int) -> dict[str, float]:
    args = ["--backend", "sqlite", "--sqlite-path", str(tmp / "startup.db"), "--queue", "st"]
    return measure_backend(lambda cmd: _ctl([*args, "push", "-c", cmd], {}, tmp), args, {},
                           tmp, runs)


def round_trip(conn_str: str, queue: str, n: int = 20) -> float:
    """Median seconds of one receive on the empty queue, warm client (this process)."""
    from azure.storage.queue import QueueClient

    client = QueueClient.from_connection_string(conn_str, queue)
    times = []
    for _ in range(n + 2):
        t0 = time.monotonic()
        list(next(client.receive_messages(messages_per_page=32).by_page(), []))
        times.append(time.monotonic() - t0)
    client.close()
    return statistics.median(times[2:])


def calls_before_first_receive(az: CountedAzurite, args: list[str], env: dict[str, str],
                               tmp: Path, control: str) -> list[str]:
    """The storage calls an empty-queue worker makes before its first receive, in order."""
    az.reset()
    _worker(args, env, tmp, tmp / f"calls-{control}.log", control)
    before: list[str] = []
    for _, kind in az.timeline():
        if kind == "queue receive":
            return before
        before.append(kind)
    raise BenchError(f"no receive seen:\n{log_tail(tmp / f'calls-{control}.log')}")


def storage_queue_startup(tmp: Path, runs: int) -> dict[str, object]:
    az = CountedAzurite(tmp)
    try:
        env = {"JOBQ_CONNECTION_STRING": az.conn_str}
        args = ["--backend", "storage-queue", "--queue", "startup"]
        # A queue made first: a worker's first run on a new queue pays its creation once.
        _ctl([*args, "push", "-c", "true"], env, tmp)
        _worker(args, env, tmp, tmp / "warm.log", "auto")
        out: dict[str, object] = dict(measure_backend(
            lambda cmd: _ctl([*args, "push", "-c", cmd], env, tmp), args, env, tmp, runs))
        off = measure_backend(lambda cmd: _ctl([*args, "push", "-c", cmd], env, tmp), args,
                              env, tmp, runs, control="off")
        out.update(first_task_control_off_s=off["first_task_s"],
                   exit_empty_control_off_s=off["exit_empty_s"],
                   round_trip_s=round_trip(az.conn_str, "startup"),
                   before_first_receive={c: calls_before_first_receive(az, args, env, tmp, c)
                                         for c in ("off", "auto")})
        return out
    finally:
        az.close()


def servicebus_startup(tmp: Path, runs: int) -> dict[str, float]:
    sys.path.insert(0, str(REPO))
    from tests.servicebus.broker import ServiceBusTestBroker

    broker = ServiceBusTestBroker().start()
    try:
        env = {"JOBQ_CONNECTION_STRING": broker.connection_string}
        args = ["--backend", "servicebus", "--queue", "startup"]
        return measure_backend(lambda cmd: _ctl([*args, "push", "-c", cmd], env, tmp), args,
                               env, tmp, runs, control="off")
    finally:
        broker.stop()


def fig_startup(b: Bench) -> None:
    runs = 3 if b.quick else RUNS
    byte_compile()
    with tempfile.TemporaryDirectory(dir=b.tmp) as name:
        tmp = Path(name)
        ref = references(runs)
        result: dict[str, object] = {"runs": runs, **ref}
        for backend, measure in (("sqlite", sqlite_startup),
                                 ("storage_queue", storage_queue_startup),
                                 ("servicebus", servicebus_startup)):
            sub = tmp / backend
            sub.mkdir()
            result[backend] = measure(sub, runs)
    b.results["startup"] = result
    reference = (f"python3 -c pass {ref['python_pass_s']:.2f} s; import azure.storage.queue "
                 f"{ref['import_storage_queue_s']:.2f} s")
    sq = result["storage_queue"]
    assert isinstance(sq, dict)
    for backend, label in (("sqlite", "SQLite"), ("storage_queue", "Azurite"),
                           ("servicebus", "Service Bus broker")):
        r = result[backend]
        assert isinstance(r, dict)
        b.row(f"Start-up, {label} (median of {runs})",
              f"first task {r['first_task_s']:.2f} s, exit on empty {r['exit_empty_s']:.2f} s",
              reference if backend == "sqlite" else
              (f"SDK import + 1 receive: {ref['import_storage_queue_s'] + sq['round_trip_s']:.2f} s"
               f" (receive {sq['round_trip_s'] * 1000:.1f} ms)" if backend == "storage_queue"
               else "--control off (no storage account)"),
              "target: first <= 0.20 s, exit <= 0.40 s" if backend == "sqlite" else "")
    calls = sq["before_first_receive"]
    assert isinstance(calls, dict)
    b.row("Azurite calls before the first receive",
          f"control off: {len(calls['off'])}, on: {len(calls['auto'])}",
          "; ".join(f"{mode}: {', '.join(kinds) or 'none'}" for mode, kinds in calls.items()),
          f"control off: first task {sq['first_task_control_off_s']:.2f} s, exit "
          f"{sq['exit_empty_control_off_s']:.2f} s")
