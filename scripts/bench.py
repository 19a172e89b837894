"""jobq-supervisor benchmarks: each figure next to its reference measured in the same run.

Run through ``scripts/bench [--quick] [--json]``.  Everything talks to loopback only; Azurite is
started here on a free port and killed by its PID.  Medians over several runs.
"""

from __future__ import annotations

import argparse
import calendar
import json
import os
import platform
import signal
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from supervisor.backends.sqlite import SqliteBackend  # noqa: E402
from supervisor.task import Task  # noqa: E402

BIN = Path(sys.executable).parent
ACCOUNT_KEY = ("Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/"
               "KBHBeksoGMGw==")

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


def pct(values: list[float], p: float) -> float:
    values = sorted(values)
    if not values:
        return float("nan")
    k = (len(values) - 1) * p / 100
    lo, hi = int(k), min(int(k) + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (k - lo)


def wait_until(cond, timeout: float, interval: float = 0.01) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(interval)
    return False


def all_dead(procs: list[psutil.Process]) -> bool:
    """Every process gone or a zombie (its parent has not reaped it yet)."""
    for p in procs:
        try:
            if p.status() != psutil.STATUS_ZOMBIE:
                return False
        except psutil.NoSuchProcess:
            continue
    return True


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def supervisor(args: list[str], cwd: Path, env: dict[str, str] | None = None,
               log: str = "sup.log") -> subprocess.Popen:
    full = dict(os.environ)
    full.update(env or {})
    out = open(cwd / log, "wb")
    return subprocess.Popen([str(BIN / "jobq-supervisor"), *args], cwd=cwd, env=full,
                            stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def json_log(path: Path) -> list[dict]:
    out = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def ts(record: dict) -> float:
    """Epoch seconds of a JSON log record's UTC time stamp."""
    t = record["time"]
    return calendar.timegm(time.strptime(t[:19], "%Y-%m-%dT%H:%M:%S")) + int(t[20:23]) / 1000


def run_span(records: list[dict]) -> float:
    """Seconds from the worker's start line to its summary line."""
    start = next(r for r in records if "started: backend" in r["message"])
    end = next(r for r in records if r["message"].startswith("summary:"))
    return ts(end) - ts(start)


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

    t0 = time.perf_counter()
    ts = [threading.Thread(target=work) for _ in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return n / (time.perf_counter() - t0)


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

    t0 = time.perf_counter()
    ts = [threading.Thread(target=work) for _ in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return done[0] / (time.perf_counter() - t0)


# --------------------------------------------------------------------------- measurements
def sqlite_throughput(tmp: Path, n: int) -> float:
    db = tmp / "tp.db"
    if db.exists():
        db.unlink()
    backend = SqliteBackend(str(db), "default", "bench")
    backend.push([Task(cmd="true") for _ in range(n)])
    backend.close()
    proc = supervisor(["--sqlite-path", str(db), "-n", "4", "--exit-when-empty",
                       "--log-format", "json", "--poll-interval", "0.05"], tmp, log="tp.log")
    assert proc.wait(600) == 0, (tmp / "tp.log").read_text()[-2000:]
    return n / run_span(json_log(tmp / "tp.log"))


def push_with_retry(backend, tasks: list[Task], tries: int = 5) -> None:
    """Azurite under load sometimes resets a connection; push what is left again."""
    from supervisor.backends.base import BackendError

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
    from supervisor.backends.storage_queue import StorageQueueBackend

    backend = StorageQueueBackend(queue, connection_string=conn_str, worker_id="bench")
    push_with_retry(backend, [Task(cmd="true") for _ in range(n)])
    backend.close()
    proc = supervisor(["--backend", "storage-queue", "--queue", queue, "-n", "4",
                       "--exit-when-empty", "--log-format", "json", "--poll-interval", "0.05"],
                      tmp, env={"JOBQ_CONNECTION_STRING": conn_str}, log="az.log")
    assert proc.wait(600) == 0, (tmp / "az.log").read_text()[-2000:]
    return n / run_span(json_log(tmp / "az.log"))


def dispatch_latency(tmp: Path, samples: int, run: int) -> list[float]:
    """push -> process start with an idle worker at its default settings."""
    db = tmp / f"lat{run}.db"
    proc = supervisor(["--sqlite-path", str(db)], tmp, log="lat.log")
    backend = None
    try:
        wait_until(lambda: db.exists(), 10)
        backend = SqliteBackend(str(db), "default", "bench", busy_timeout=30)
        out = []
        for i in range(samples):
            mark = tmp / f"lat{run}-{i}"
            time.sleep(0.37)  # land at a random phase of the poll cycle
            t0 = time.time()
            backend.push([Task(cmd=f"date +%s.%N > {mark}")])
            wait_until(lambda m=mark: m.exists() and m.read_text().strip(), 10)
            out.append(float(mark.read_text()) - t0)
        return out
    finally:
        if backend:
            backend.close()
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)


def overhead(tmp: Path, tasks: int, window: float, windows: int) -> tuple[list[float], float]:
    """Supervisor CPU-s/s in each of `windows` windows, and RSS (MiB), while `tasks` sleep
    tasks run, measured in the steady state: every task started and, with the short lease,
    every lease thread running (they start halfway to their first renewal)."""
    db = tmp / f"ov{tasks}.db"
    backend = SqliteBackend(str(db), "default", "bench")
    backend.push([Task(cmd="sleep 600") for _ in range(tasks)])
    backend.close()
    args = ["--sqlite-path", str(db), "-n", str(tasks), "--kill-timeout", "5"]
    if tasks >= 1000:
        # A short lease so that renewals happen in the window: 100 renewals/s.
        args += ["--lock-duration", "30", "--renew-interval", "10"]
    proc = supervisor(args, tmp, log=f"ov{tasks}.log")
    try:
        ps = psutil.Process(proc.pid)
        conn = sqlite3.connect(db, timeout=30)
        wait_until(lambda: conn.execute("SELECT COUNT(*) FROM jobs WHERE status='running'")
                   .fetchone()[0] == tasks, 300, 0.2)
        conn.close()
        # Rows are leased at once; the processes start over the next seconds.
        wait_until(lambda: sum(c.name() == "sleep" for c in ps.children()) == tasks, 300, 0.2)
        if tasks >= 1000:
            wait_until(lambda: ps.num_threads() >= tasks, 60, 0.2)
        time.sleep(2.0)  # let start-up work settle
        cpus = []
        for _ in range(windows):
            c0 = sum(ps.cpu_times()[:2])
            time.sleep(window)
            cpus.append((sum(ps.cpu_times()[:2]) - c0) / window)
        rss = ps.memory_info().rss / 2**20
        return cpus, rss
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(120)


def sigterm_forwarding(tmp: Path, tasks: int) -> list[float]:
    rec = tmp / "rec.py"
    rec.write_text(TERM_RECORDER)
    db = tmp / "fw.db"
    if db.exists():
        db.unlink()
    backend = SqliteBackend(str(db), "default", "bench")
    outs = [tmp / f"fw{i}" for i in range(tasks)]
    for o in outs:
        for p in (o, Path(str(o) + ".ready")):
            if p.exists():
                p.unlink()
    backend.push([Task(cmd=f"exec {sys.executable} {rec} {o}") for o in outs])
    backend.close()
    proc = supervisor(["--sqlite-path", str(db), "-n", str(tasks)], tmp, log="fw.log")
    wait_until(lambda: all(Path(str(o) + ".ready").exists() for o in outs), 120, 0.05)
    time.sleep(0.5)
    t0 = time.time()
    proc.send_signal(signal.SIGTERM)
    proc.wait(60)
    return [float(o.read_text().split()[0]) - t0 for o in outs if o.exists()]


def escalation_lateness(tmp: Path, kill_timeout: float = 1.0) -> float:
    db = tmp / "esc.db"
    if db.exists():
        db.unlink()
    backend = SqliteBackend(str(db), "default", "bench")
    backend.push([Task(cmd="trap '' TERM; sleep 600; true")])
    backend.close()
    proc = supervisor(["--sqlite-path", str(db), "--kill-timeout", str(kill_timeout)], tmp,
                      log="esc.log")
    ps = psutil.Process(proc.pid)
    wait_until(lambda: any(c.name() == "sleep" for c in ps.children(recursive=True)), 30)
    victims = [c for c in ps.children(recursive=True) if c.name() in ("sleep", "bash")]
    t0 = time.time()
    proc.send_signal(signal.SIGTERM)

    wait_until(lambda: all_dead(victims), kill_timeout + 30, 0.002)
    dead = time.time()
    proc.wait(60)
    return dead - (t0 + kill_timeout)


def sqlite_lock_loss(tmp: Path) -> tuple[float, float]:
    """(seconds from the logged lock loss to the group's death, margin before LockedUntil)."""
    db = tmp / "ll.db"
    if db.exists():
        db.unlink()
    backend = SqliteBackend(str(db), "default", "bench")
    [tid] = backend.push([Task(cmd="sleep 600 & sleep 600; true")])
    backend.close()
    proc = supervisor(["--sqlite-path", str(db), "--lock-duration", "6", "--renew-interval", "1",
                       "--log-format", "json"], tmp, log="ll.log")
    ps = psutil.Process(proc.pid)
    wait_until(lambda: sum(c.name() == "sleep" for c in ps.children(recursive=True)) == 2, 30)
    victims = [c for c in ps.children(recursive=True) if c.name() in ("sleep", "bash")]
    time.sleep(1.5)
    conn = sqlite3.connect(db, timeout=30, isolation_level=None)
    conn.execute("BEGIN EXCLUSIVE")
    locked_until = conn.execute("SELECT locked_until FROM jobs WHERE id=?", (tid,)).fetchone()[0]
    wait_until(lambda: all_dead(victims), 20, 0.002)
    dead = time.time()
    conn.execute("ROLLBACK")
    conn.close()
    proc.send_signal(signal.SIGTERM)
    proc.wait(60)
    lost = next(r for r in json_log(tmp / "ll.log") if r["message"].startswith("lock lost"))
    return dead - ts(lost), locked_until - dead


def azurite_lock_loss(tmp: Path, conn_str: str, port: int, queue: str) -> float:
    """Margin between the task group's death and the message becoming visible again."""
    sys.path.insert(0, str(REPO))
    from azure.storage.queue import QueueClient

    from supervisor.backends.storage_queue import StorageQueueBackend
    from tests.faults.proxy import FaultProxy

    backend = StorageQueueBackend(queue, connection_string=conn_str, worker_id="bench")
    backend.push([Task(cmd="sleep 600 & sleep 600; true")])
    backend.close()
    with FaultProxy(("127.0.0.1", port)) as proxy:
        via = conn_str.replace(f":{port}/", f":{proxy.address[1]}/")
        proc = supervisor(["--backend", "storage-queue", "--queue", queue,
                           "--visibility-timeout", "6", "--renew-interval", "1"], tmp,
                          env={"JOBQ_CONNECTION_STRING": via}, log="azll.log")
        ps = psutil.Process(proc.pid)
        wait_until(lambda: sum(c.name() == "sleep" for c in ps.children(recursive=True)) == 2,
                   30)
        victims = [c for c in ps.children(recursive=True) if c.name() in ("sleep", "bash")]
        time.sleep(1.5)
        proxy.blackhole()
        wait_until(lambda: all_dead(victims), 20, 0.002)
        dead = time.time()
        qc = QueueClient.from_connection_string(conn_str, queue)
        wait_until(lambda: list(qc.peek_messages()), 30, 0.02)
        visible = time.time()
        proxy.restore()
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    return visible - dead


# --------------------------------------------------------------------------- Azurite
class Azurite:
    def __init__(self, tmp: Path) -> None:
        binary = os.environ.get("AZURITE_QUEUE_BIN") or str(
            REPO / ".azurite" / "node_modules" / ".bin" / "azurite-queue")
        self.port = free_port()
        cwd = tmp / "azurite"
        cwd.mkdir()
        self.proc = subprocess.Popen(
            [binary, "--queueHost", "127.0.0.1", "--queuePort", str(self.port),
             "--inMemoryPersistence", "--skipApiVersionCheck", "--disableTelemetry", "--silent"],
            cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True)

        def up() -> bool:
            with socket.socket() as s:
                return s.connect_ex(("127.0.0.1", self.port)) == 0
        if not wait_until(up, 30, 0.1):
            raise RuntimeError("Azurite did not start")
        self.conn_str = (f"DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;"
                         f"AccountKey={ACCOUNT_KEY};"
                         f"QueueEndpoint=http://127.0.0.1:{self.port}/devstoreaccount1")

    def close(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(10)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="fewer tasks and runs (a smoke test)")
    ap.add_argument("--json", action="store_true", help="print the results as JSON")
    ap.add_argument("--skip-azurite", action="store_true")
    args = ap.parse_args()
    runs = 1 if args.quick else 3
    n = 200 if args.quick else 1000
    results: dict[str, object] = {
        "machine": f"{platform.node()}: {platform.processor() or platform.machine()}, "
                   f"{os.cpu_count()} cores, {psutil.virtual_memory().total / 2**30:.0f} GiB, "
                   f"Python {platform.python_version()}",
        "date": time.strftime("%Y-%m-%d"),
        "runs": runs,
        "tasks": n,
    }
    rows: list[tuple[str, str, str, str]] = []
    with tempfile.TemporaryDirectory(prefix="jobq-bench-") as td:
        tmp = Path(td)
        # Reference and supervisor alternate, and the ratio is taken per pair: this VM's
        # raw spawn rate itself drifts by +-20 % over minutes.
        pairs = [(raw_spawn_rate(n), sqlite_throughput(tmp, n)) for _ in range(runs)]
        raw = statistics.median(r for r, _ in pairs)
        sq = statistics.median(s for _, s in pairs)
        ratio = statistics.median(s / r for r, s in pairs)
        results.update(raw_spawn_rate=raw, sqlite_throughput=sq, sqlite_ratio=ratio,
                       sqlite_ratios=[s / r for r, s in pairs])
        rows.append(("SQLite throughput, -n 4", f"{sq:.0f} tasks/s",
                     f"raw bash -c true spawn, 4 threads: {raw:.0f}/s",
                     f"{ratio:.0%} (target >= 50%)"))
        if not args.skip_azurite:
            azurite = Azurite(tmp)
            try:
                azpairs = [(raw_azurite_rate(azurite.conn_str, f"raw{i}", n),
                            azurite_throughput(tmp, azurite.conn_str, f"tp{i}", n))
                           for i in range(runs)]
                rawaz = statistics.median(r for r, _ in azpairs)
                azt = statistics.median(t for _, t in azpairs)
                azratio = statistics.median(t / r for r, t in azpairs)
                results.update(raw_azurite_rate=rawaz, azurite_throughput=azt,
                               azurite_ratio=azratio)
                rows.append(("Azurite throughput, -n 4", f"{azt:.0f} tasks/s",
                             f"raw receive+delete, 4 threads: {rawaz:.0f}/s",
                             f"{azratio:.0%} (target >= 60%)"))
                margins = [azurite_lock_loss(tmp, azurite.conn_str, azurite.port, f"ll{i}")
                           for i in range(runs)]
                results["azurite_lock_loss_margin_s"] = margins
                rows.append(("Lock loss, Azurite black-holed", f"margin min {min(margins):.2f} s",
                             "kill before the message is visible again",
                             "all before expiry" if min(margins) > 0 else "LATE"))
            finally:
                azurite.close()
        lat = []
        for run in range(runs):
            lat += dispatch_latency(tmp, 10 if args.quick else 20, run)
        results.update(dispatch_latency_p50=pct(lat, 50), dispatch_latency_p99=pct(lat, 99))
        rows.append(("Dispatch latency (idle worker)",
                     f"p50 {pct(lat, 50) * 1000:.0f} ms, p99 {pct(lat, 99) * 1000:.0f} ms",
                     "push -> process start", ""))
        sizes = (4, 64) if args.quick else (4, 64, 1000)
        for k in sizes:
            # One supervisor per size, CPU measured over `runs` consecutive 10 s windows
            # (starting 1,000 tasks again for each would measure start-up, not running).
            cpus, rss = overhead(tmp, k, 5.0 if args.quick else 10.0, runs)
            cpu = statistics.median(cpus)
            results[f"overhead_{k}"] = {"cpu_s_per_s": cpu, "cpu_s_per_s_windows": cpus,
                                        "rss_mib": rss}
            target = 0.01 if k == 4 else (0.05 if k == 1000 else None)
            rows.append((f"Supervisor overhead, {k} sleeping tasks",
                         f"{cpu:.4f} CPU-s/s (max {max(cpus):.4f}), {rss:.0f} MiB RSS",
                         "", f"target <= {target}" if target else ""))
        fw = []
        for _ in range(runs):
            fw += sigterm_forwarding(tmp, 32)
        results.update(sigterm_p50=pct(fw, 50), sigterm_p99=pct(fw, 99))
        rows.append(("SIGTERM forwarding, 32 tasks",
                     f"p50 {pct(fw, 50) * 1000:.1f} ms, p99 {pct(fw, 99) * 1000:.1f} ms",
                     "supervisor SIGTERM -> task handler", "target p99 <= 50 ms"))
        esc = [escalation_lateness(tmp) for _ in range(runs)]
        results["escalation_late_s"] = esc
        rows.append(("Kill escalation (kill-timeout 1 s)",
                     f"late by median {statistics.median(esc) * 1000:.0f} ms, "
                     f"max {max(esc) * 1000:.0f} ms", "SIGKILL - (SIGTERM + timeout)",
                     "target <= 100 ms"))
        ll = [sqlite_lock_loss(tmp) for _ in range(runs)]
        results["sqlite_lock_loss"] = [{"reaction_s": a, "margin_s": b} for a, b in ll]
        rows.append(("Lock loss, SQLite locked",
                     f"reaction {statistics.median(a for a, _ in ll) * 1000:.0f} ms, "
                     f"margin min {min(b for _, b in ll):.2f} s",
                     "deadline -> group dead; LockedUntil - death",
                     "all before expiry" if min(b for _, b in ll) > 0 else "LATE"))
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        print(f"jobq-supervisor bench, {results['date']}, {results['machine']}")
        print(f"medians over {runs} run(s), {n} tasks for throughput\n")
        widths = [max(len(r[i]) for r in rows) for i in range(4)]
        for r in rows:
            print("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
    return 0


if __name__ == "__main__":
    sys.exit(main())
