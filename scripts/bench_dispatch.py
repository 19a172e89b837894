"""Issue 19's dispatch figures: whole batch runs draining ``true`` tasks, next to references.

A drain is timed as a cron batch run sees it: from the exec of ``jobq-supervisor
--exit-when-empty`` (interpreter and SDK start-up included) to its exit, default options
otherwise.  References in the same run, on the same broker:

* Azurite: the SDK's single-message receive+delete loop from 4 threads
  (``bench_measure.raw_azurite_rate``) and ai4s-jobq 3.13.1's worker ``-n 4`` (its own venv,
  made once under ``.bench/``), timed the same way: its workers exit once a receive finds the
  queue empty.
* Service Bus: the SDK's receive+complete loop (one message per call, prefetch 0) from 4
  threads, against the project's test broker (``tests/servicebus/broker.py``) run in a
  process of its own, so that neither side shares an interpreter with it.

Everything here runs on the bench's main thread, except the reference loops' own threads.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from functools import partial
from pathlib import Path
from statistics import median
from typing import Any, TypeVar

from bench_measure import push_with_retry, raw_azurite_rate, raw_spawn_rate
from benchlib import BIN, REPO, Bench, BenchError, log_tail, peer_venv, stop, wait_until

AI4S_VERSION = "3.13.1"
T = TypeVar("T")
SUMMARY = re.compile(r"summary: succeeded=(\d+) failed=(\d+) .*lock_lost=(\d+)")

# The test broker in a process of its own: it writes its port to argv[2] once it listens
# (renamed into place: the bench never reads half a number), and runs until it is killed.
# Its internal errors go to argv[3], which the bench checks when it kills it.
BROKER = r'''
import logging, os, signal, sys
sys.path.insert(0, sys.argv[1])
logging.basicConfig(filename=sys.argv[3], level=logging.ERROR)
from tests.servicebus.broker import ServiceBusTestBroker
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
broker = ServiceBusTestBroker().start()
with open(sys.argv[2] + ".tmp", "w") as fh:
    fh.write(str(broker.port))
os.rename(sys.argv[2] + ".tmp", sys.argv[2])
signal.sigwait({signal.SIGTERM, signal.SIGINT})
broker.stop()
'''


# --------------------------------------------------------------------------- processes
def timed_exit(cmd: list[str], cwd: Path, log: str, env: dict[str, str],
               timeout: float = 900.0) -> float:
    """Seconds from the exec of ``cmd`` to its exit (which must be 0 within ``timeout``);
    output in ``cwd/log``, stdin /dev/null (no progress bars), its own session, stopped
    however this ends."""
    full = {**os.environ, **env}
    with open(cwd / log, "wb") as out:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=cwd, env=full, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
        try:
            try:
                code = proc.wait(timeout)
            except subprocess.TimeoutExpired:
                raise BenchError(f"{cmd[0]} still running after {timeout:g} s:\n"
                                 f"{log_tail(cwd / log)}") from None
            seconds = time.perf_counter() - t0
        finally:
            stop(proc, 30)
    if code != 0:
        raise BenchError(f"{' '.join(cmd[:3])} exited with {code}:\n{log_tail(cwd / log)}")
    return seconds


def supervisor_drain(tmp: Path, args: list[str], env: dict[str, str], n: int, log: str,
                     lost: Counter[str]) -> float:
    """tasks/s of one ``jobq-supervisor --exit-when-empty`` run over ``n`` pushed tasks.
    Its summary must account for all ``n``, each succeeded or lock lost (a delete that timed
    out while the broker stalled, retried into "message gone": the task ran and its
    message is gone, so the drain is complete; counted in ``lost[log]`` and shown)."""
    seconds = timed_exit([str(BIN / "jobq-supervisor"), *args, "--exit-when-empty"], tmp, log,
                         env)
    found = SUMMARY.search((tmp / log).read_text(errors="replace"))
    if not found:
        raise BenchError(f"no summary line in {log}:\n{log_tail(tmp / log)}")
    if int(found.group(1)) + int(found.group(3)) != n:
        raise BenchError(f"{log}: {found.group(0)}, of {n} tasks pushed (the rest never ran: "
                         "e.g. received by a call that timed out, invisible until their "
                         f"visibility timeout)\n{log_tail(tmp / log)}")
    lost[log] += int(found.group(3))
    return n / seconds


def in_threads_timed(open_: Callable[[], AbstractContextManager[T]],
                     loop: Callable[[T], None], threads: int, timeout: float = 600.0) -> float:
    """Each thread opens its client (``open_``, untimed), then all run ``loop`` at once:
    seconds from the common start to the last one's end.  A thread's exception, or a
    thread still running after ``timeout``, raises here."""
    start = threading.Barrier(threads + 1)
    errors: list[BaseException] = []

    def work() -> None:
        try:
            with open_() as client:
                start.wait(60)
                loop(client)
        except BaseException as exc:  # reported on the bench's thread
            errors.append(exc)
            start.abort()

    pool = [threading.Thread(target=work, name=f"bench-ref-{i}") for i in range(threads)]
    for t in pool:
        t.start()
    try:
        start.wait(60)
    except threading.BrokenBarrierError:
        pass  # a thread failed to open: its error is raised below
    t0 = time.perf_counter()
    deadline = time.monotonic() + timeout
    for t in pool:
        t.join(max(0.0, deadline - time.monotonic()))
    seconds = time.perf_counter() - t0
    if any(t.is_alive() for t in pool):
        raise BenchError(f"reference loop still running after {timeout:g} s")
    if errors:
        raise BenchError(f"reference loop failed: {errors[0]!r}")
    return seconds


# --------------------------------------------------------------------------- ai4s-jobq
def ai4s_jobq() -> Path:
    """ai4s-jobq's command in its own venv, made once (pip install from the index)."""
    return peer_venv("ai4s-jobq", AI4S_VERSION) / "ai4s-jobq"


def queue_length(conn_str: str, queue: str) -> int:
    from azure.storage.queue import QueueClient

    qc = QueueClient.from_connection_string(conn_str, queue)
    count = qc.get_queue_properties().approximate_message_count
    if count is None:
        raise BenchError(f"no message count for queue {queue}")
    return int(count)


def ai4s_drain(tmp: Path, exe: Path, conn_str: str, queue: str, n: int) -> float:
    """tasks/s of ``ai4s-jobq ACCOUNT/QUEUE worker -n 4`` over ``n`` ``true`` tasks pushed
    with its own ``push``; every task must be logged completed and the queue left empty."""
    # Its pid file goes to the scratch directory, not ~/.cache (appdirs follows XDG).
    env = {"JOBQ_CONNECTION_STRING": conn_str, "XDG_CACHE_HOME": str(tmp / "ai4s-cache"),
           "JOBQ_COPILOT_SKILL": "0"}
    spec = f"devstoreaccount1/{queue}"
    pushed = subprocess.run([str(exe), spec, "push"], input="true\n" * n, text=True,
                            capture_output=True, cwd=tmp, env={**os.environ, **env},
                            timeout=600)
    if pushed.returncode != 0 or queue_length(conn_str, queue) != n:
        raise BenchError(f"ai4s-jobq push of {n} tasks failed:\n{pushed.stderr[-2000:]}")
    log = f"ai4s-{queue}.log"
    seconds = timed_exit([str(exe), spec, "worker", "-n", "4"], tmp, log, env)
    done = (tmp / log).read_text(errors="replace").count("Completed task")
    left = queue_length(conn_str, queue)
    if done != n or left:
        raise BenchError(f"ai4s-jobq completed {done} of {n} tasks, {left} left in the queue:"
                         f"\n{log_tail(tmp / log)}")
    return n / seconds


# --------------------------------------------------------------------------- Azurite
def sq_drain(tmp: Path, conn_str: str, queue: str, n: int, slots: int,
             lost: Counter[str]) -> float:
    from supervisor.backends.storage_queue.backend import StorageQueueBackend
    from supervisor.core.task import Task

    backend = StorageQueueBackend(queue, connection_string=conn_str, worker_id="bench")
    try:
        push_with_retry(backend, [Task(cmd="true") for _ in range(n)])
    finally:
        backend.close()
    pushed = queue_length(conn_str, queue)
    if pushed != n:  # a push retried after a reset whose first try was applied after all
        raise BenchError(f"{queue}: {pushed} messages queued for {n} pushes (a push retried "
                         "after Azurite reset its connection was applied twice)")
    rate = supervisor_drain(tmp, ["--backend", "storage-queue", "--queue", queue, "-n",
                                  str(slots)], {"JOBQ_CONNECTION_STRING": conn_str}, n,
                            f"{queue}.log", lost)
    if queue_length(conn_str, queue):
        raise BenchError(f"jobq-supervisor exited with messages left in {queue}")
    return rate


def fig_drain_azurite(b: Bench) -> None:
    """Acceptance 1 of issue 19: -n 4 and -n 16 next to the raw loop and ai4s-jobq."""
    assert b.azurite is not None
    conn = b.azurite.conn_str
    exe = ai4s_jobq()
    lost: Counter[str] = Counter()

    def sides(i: int) -> dict[str, Callable[[], float]]:
        return {"raw": partial(raw_azurite_rate, conn, f"dsp{i}raw", b.n),
                "n4": partial(sq_drain, b.tmp, conn, f"dsp{i}n4", b.n, 4, lost),
                "n16": partial(sq_drain, b.tmp, conn, f"dsp{i}n16", b.n, 16, lost),
                "ai4s": partial(ai4s_drain, b.tmp, exe, conn, f"dsp{i}ai4s", b.n)}

    runs, discarded = paired_runs(b.runs, sides, "drain_azurite")
    b.results.update(drain_azurite=runs, drain_azurite_discarded=discarded)
    raw, ai4s = median([r["raw"] for r in runs]), median([r["ai4s"] for r in runs])
    for slots in (4, 16):
        key = f"n{slots}"
        rate = median([r[key] for r in runs])
        vs_raw = median([r[key] / r["raw"] for r in runs])
        vs_ai4s = median([r[key] / r["ai4s"] for r in runs])
        kept_lost = sum(lost[f"dsp{r['run']:.0f}{key}.log"] for r in runs)
        b.results[f"drain_azurite_{key}"] = {"tasks_per_s": rate, "vs_raw": vs_raw,
                                             "vs_ai4s": vs_ai4s, "lock_lost": kept_lost}
        b.row(f"Azurite drain, {b.n} true, -n {slots} (exec -> exit)",
              f"{rate:.0f} tasks/s{notes(kept_lost, discarded, b.runs)}",
              f"raw 1-msg receive+delete, 4 threads: {raw:.0f}/s; "
              f"ai4s-jobq {AI4S_VERSION} -n 4 (exec -> exit): {ai4s:.1f} tasks/s",
              f"{verdict(vs_raw, 1.0)} raw, {verdict(vs_ai4s, 10.0)} ai4s-jobq")


# --------------------------------------------------------------------------- Service Bus
@contextmanager
def broker(tmp: Path) -> Iterator[str]:
    """The test broker in its own process; yields its connection string; killed after,
    and its internal errors raised then."""
    port_file, errors = tmp / "sb.port", tmp / "sb-broker.log"
    for p in (port_file, errors):
        p.unlink(missing_ok=True)
    proc = subprocess.Popen([sys.executable, "-c", BROKER, str(REPO), str(port_file),
                             str(errors)], stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        wait_until(port_file.exists, 30, 0.05, what="the Service Bus test broker to listen")
        yield (f"Endpoint=sb://127.0.0.1:{port_file.read_text()};SharedAccessKeyName=test;"
               "SharedAccessKey=c2VjcmV0LWtleS1mb3ItdGhlLXRlc3RzLW9ubHk9PQ==;"
               "UseDevelopmentEmulator=true")
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(10)
    if errors.exists() and errors.read_text().strip():
        raise BenchError(f"the Service Bus test broker failed:\n{log_tail(errors)}")


def raw_servicebus_rate(conn_str: str, queue: str, n: int, threads: int = 4) -> float:
    """Receive (one message per call, prefetch 0, PeekLock) + complete of ``n`` messages
    from ``threads`` threads, each with its own client: messages/s."""
    from azure.servicebus import ServiceBusClient, ServiceBusMessage

    with ServiceBusClient.from_connection_string(conn_str) as client, \
            client.get_queue_sender(queue) as sender:
        for lo in range(0, n, 100):
            sender.send_messages([ServiceBusMessage(f"m{i}") for i in range(lo, min(n, lo + 100))])
    left = [n]
    lock = threading.Lock()

    @contextmanager
    def receiver() -> Iterator[Any]:
        with ServiceBusClient.from_connection_string(conn_str) as client, \
                client.get_queue_receiver(queue, prefetch_count=0) as r:
            yield r  # the link is open: the clock starts after this

    def loop(r: Any) -> None:
        while True:
            with lock:
                if left[0] <= 0:
                    return
                left[0] -= 1
            got = r.receive_messages(max_message_count=1, max_wait_time=30)
            if not got:
                raise BenchError("a message the broker holds was not received within 30 s")
            r.complete_message(got[0])

    return n / in_threads_timed(receiver, loop, threads)


def sb_drain(tmp: Path, conn_str: str, queue: str, n: int, slots: int,
             lost: Counter[str]) -> float:
    from supervisor.backends.servicebus.backend import ServiceBusBackend
    from supervisor.core.task import Task

    backend = ServiceBusBackend(queue, connection_string=conn_str, worker_id="bench")
    try:
        backend.push([Task(cmd="true") for _ in range(n)])
    finally:
        backend.close()
    # --lock-duration: the broker's queues lock for 60 s (the emulator has no
    # administration API to read it from).
    return supervisor_drain(tmp, ["--backend", "servicebus", "--queue", queue, "-n",
                                  str(slots), "--lock-duration", "60"],
                            {"JOBQ_CONNECTION_STRING": conn_str}, n, f"{queue}.log", lost)


def fig_drain_servicebus(b: Bench) -> None:
    """Acceptance 2 of issue 19: -n 4 and -n 16 next to the raw receive+complete loop."""
    with broker(b.tmp) as conn:
        servicebus_drains(b, conn, "sb", "drain_servicebus",
                          "Service Bus drain, {n} true, -n {slots} (exec -> exit)",
                          "raw 1-msg receive+complete, 4 threads: {raw:.0f}/s (test broker); "
                          "bash -c true alone, 4 threads: {spawn:.0f}/s; exec -> SDK imported "
                          "and one receiver open: {floor:.2f} s", spawn=True)


def sdk_floor(conn_str: str, queue: str, runs: int = 5) -> float:
    """Median seconds from the exec of a fresh interpreter to one PeekLock receiver open on
    ``queue`` (``import azure.servicebus``, the client, the link): what any process timed
    from exec that receives with the SDK pays before its first message."""
    code = ("import os, sys\n"
            "from azure.servicebus import ServiceBusClient\n"
            "c = ServiceBusClient.from_connection_string(sys.argv[1])\n"
            "c.get_queue_receiver(sys.argv[2], prefetch_count=0).__enter__()\n"
            "os._exit(0)\n")
    times = []
    for _ in range(runs):
        t0 = time.monotonic()
        subprocess.run([sys.executable, "-c", code, conn_str, queue], check=True, timeout=60)
        times.append(time.monotonic() - t0)
    return median(times)


def servicebus_drains(b: Bench, conn: str, prefix: str, what: str, label: str,
                      reference: str, spawn: bool = False) -> None:
    """Paired runs of the raw loop and ``-n 4`` / ``-n 16`` drains on ``conn`` (queues named
    ``prefix``...); results under ``what``, a row per slot count (``label`` formatted with
    ``n`` and ``slots``, ``reference`` with ``raw``, ``spawn`` and ``floor``).

    ``spawn``: also time ``bash -c true`` spawned and reaped from 4 threads with nothing else
    (``raw_spawn_rate``), the ceiling of any worker that starts a shell per task, and the
    SDK's start-up floor (``sdk_floor``).  The raw loop's clock starts with its links open;
    a drain's at exec.  Where the floor alone is longer than the whole run 0.8x of the raw
    rate allows for ``n`` tasks, the verdict says the target cannot be reached here."""
    lost: Counter[str] = Counter()

    def sides(i: int) -> dict[str, Callable[[], float]]:
        out: dict[str, Callable[[], float]] = {
            "raw": partial(raw_servicebus_rate, conn, f"{prefix}{i}raw", b.n),
            "n4": partial(sb_drain, b.tmp, conn, f"{prefix}{i}n4", b.n, 4, lost),
            "n16": partial(sb_drain, b.tmp, conn, f"{prefix}{i}n16", b.n, 16, lost)}
        if spawn:
            out["spawn"] = partial(raw_spawn_rate, b.n)
        return out

    runs, discarded = paired_runs(b.runs, sides, what)
    b.results.update({what: runs, f"{what}_discarded": discarded})
    raw = median([r["raw"] for r in runs])
    ceiling = median([r["spawn"] for r in runs]) if spawn else 0.0
    floor = sdk_floor(conn, f"{prefix}0raw", 3 if b.quick else 5) if spawn else 0.0
    if spawn:
        b.results[f"{what}_spawn_ceiling"] = ceiling
        b.results[f"{what}_sdk_floor_s"] = floor
    for slots in (4, 16):
        key = f"n{slots}"
        rate = median([r[key] for r in runs])
        vs_raw = median([r[key] / r["raw"] for r in runs])
        kept_lost = sum(lost[f"{prefix}{r['run']:.0f}{key}.log"] for r in runs)
        figures: dict[str, float] = {"tasks_per_s": rate, "vs_raw": vs_raw,
                                     "lock_lost": kept_lost}
        b.results[f"{what}_{key}"] = figures
        said = verdict(vs_raw, 0.8)
        if spawn:
            vs_spawn = median([r[key] / r["spawn"] for r in runs])
            figures["vs_spawn"] = vs_spawn
            said += f" raw, {vs_spawn:.2f}x bash -c true alone"
            budget = b.n / (0.8 * raw)
            if vs_raw < 0.8 and (floor >= budget or 0.8 * raw > ceiling):
                why = (f"the SDK's start-up alone ({floor:.2f} s) is longer than the "
                       f"{budget:.2f} s a whole {b.n}-task run may take" if floor >= budget
                       else f"0.8x raw = {0.8 * raw:.0f}/s is more shells than this machine "
                            f"spawns with nothing else running")
                said += f" (unreachable here: {why})"
        else:
            said += " raw"
        b.row(label.format(n=b.n, slots=slots),
              f"{rate:.0f} tasks/s{notes(kept_lost, discarded, b.runs)}",
              reference.format(raw=raw, spawn=ceiling, floor=floor), said)


def paired_runs(runs: int, sides: Callable[[int], dict[str, Callable[[], float]]],
                what: str) -> tuple[list[dict[str, float]], list[str]]:
    """``runs`` runs of every side (``sides(i)``: name -> measurement; "run": i), in reverse order
    every other run: a drift of the VM's speed weighs on both sides alike.  Each number also
    goes to stderr at once.  A run where one side fails (BenchError: a drain that left tasks
    behind, a stalled broker) is discarded whole and its reason kept; none left raises."""
    kept: list[dict[str, float]] = []
    discarded: list[str] = []
    for i in range(runs):
        measure = sides(i)
        order = list(measure) if i % 2 == 0 else list(reversed(measure))
        out = {"run": float(i)}
        try:
            for name in order:
                out[name] = measure[name]()
                print(f"{what} run {i}: {name} {out[name]:.1f}/s", file=sys.stderr, flush=True)
        except BenchError as exc:
            print(f"{what} run {i}: discarded: {exc}", file=sys.stderr, flush=True)
            discarded.append(f"run {i}: {str(exc).splitlines()[0]}")
            continue
        kept.append(out)
    if not kept:
        raise BenchError(f"{what}: every run failed: {discarded}")
    return kept, discarded


def notes(lost: int, discarded: list[str], runs: int) -> str:
    """What the value's reader must know: tasks whose delete was retried into "message gone"
    after a broker stall (counted lock lost, drained all the same); runs discarded."""
    out = f", {lost} tasks lock lost (deletes retried after a stall)" if lost else ""
    out += f", {len(discarded)} of {runs} runs discarded" if discarded else ""
    return f" ({out[2:]})" if out else ""


def verdict(ratio: float, target: float) -> str:
    return f"{ratio:.2f}x (target >= {target:g}x{'' if ratio >= target else ', MISSED'})"
