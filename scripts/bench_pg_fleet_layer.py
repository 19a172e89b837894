"""Issue 29's figures: the fleet layer on PostgreSQL, live (``scripts/bench --only pg-fleet``).

One PostgreSQL 15 server for the whole figure, with the production settings of issue 28's
figure (bench_postgres.production_server: fsync on), a fresh database for each measurement,
real ``jobq-supervisor`` and ``jobq-ctl`` processes, each both with ``--postgres-notify on``
and ``off`` (the default control interval, 5 s, and poll interval, 1 s):

* cancel -> SIGTERM: tasks whose SIGTERM handler stamps the time (bench_measure's
  TERM_RECORDER), each cancelled at a random moment; from ``jobq-ctl cancel`` returning
  to the stamp;
* ``logs -f`` line latency: a task prints its time every 200 ms, ``jobq-ctl logs -f``
  started before it reads; from a line's printing to the follower's read;
* a 150 MB output flood beside 4 tasks whose leases renew every 0.1 s (6 s lock): each
  renewal call's round trip, as the lease keeper times it for its metrics
  (``Metrics.renewal``, wrapped by RENEWAL_RECORDER: nothing in the supervisor is changed),
  in a quiet window and while the flood runs (from its start until its output is stored
  and complete), and the same beside the same flood with ``--task-output local`` (no
  store: what the fleet layer adds is the difference); lost leases; the flood's output
  stored up to
  ``--task-output-max`` with its marker; the supervisor's peak RSS (psutil) in each.

Everything runs on the bench's main thread, except the RSS sampler's thread and a timer
that kills a follower that outlives its deadline.
"""

from __future__ import annotations

import os
import random
import statistics
import subprocess
import sys
import threading
import time
from functools import partial
from pathlib import Path
from typing import Any

import psutil
from bench_measure import TERM_RECORDER, has_text
from bench_postgres import PgFigure, production_server
from benchlib import BIN, REPO, Bench, BenchError, log_tail, pct, supervisor, wait_until

sys.path.insert(0, str(REPO))

from supervisor.fleet.control.postgres import APP_CONTROL  # noqa: E402

MODES = ("on", "off")
SLEEPERS = 4  # tasks whose leases renew beside the flood
LEASE = ["--lock-duration", "6", "--renew-interval", "0.1"]
FLOOD_MB = 150
OUTPUT_MAX = 100 << 20  # --task-output-max (its default, given explicitly)
FLOOD = f"head -c {FLOOD_MB * 1000 * 1000} /dev/zero | tr '\\0' x | fold -w 100"
FOLLOW_EVERY = 0.2  # s between the follow task's lines
RANDOM = random.Random(29)  # the moments of the cancels: the same in every run

# A jobq-supervisor whose lease keepers' renewal timings ("<epoch> <seconds> <ok>", one line
# per renewal call) go to the file named by its first argument: the keeper hands each call's
# duration to Metrics.renewal (worker/keeper.py ``_renewed``), replaced here.
RENEWAL_RECORDER = r'''
import sys, threading, time
from supervisor.worker.main import worker_main
from supervisor.worker.metrics import Metrics
out = open(sys.argv.pop(1), "a", buffering=1)
lock = threading.Lock()
def renewal(self, duration, ok):
    with lock:
        out.write(f"{time.time()} {duration} {int(ok)}\n")
Metrics.renewal = renewal
sys.exit(worker_main())
'''


def notify_args(mode: str) -> list[str]:
    return ["--postgres-notify", mode]


def push(fig: PgFigure, db: str, mode: str, *cmds: str) -> list[str]:
    args = ["push"]
    for cmd in cmds:
        args += ["-c", cmd]
    return fig.ctl(db, *args, *notify_args(mode)).split()


def listening(fig: PgFigure, db: str) -> bool:
    """A control store LISTEN connection is open on ``db``."""
    rows = fig.srv.admin("SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND "
                         "application_name = %s AND query LIKE 'LISTEN %%'",
                         params=(db, APP_CONTROL))
    return bool(rows[0][0])


# --------------------------------------------------------------------------- cancel
def cancel_latency(fig: PgFigure, mode: str, samples: int) -> dict[str, list[float]]:
    """``samples`` tasks on one worker -n samples, cancelled one by one at random moments:
    seconds from ``jobq-ctl cancel`` returning to each task's SIGTERM ("returned": the
    issue's measure, negative when the SIGTERM came while the command was still exiting,
    after its commit) and from its exec ("exec")."""
    tmp = fig.b.tmp
    db = fig.fresh_db(f"cancel_{mode}", 0)
    marks = [tmp / f"pg-cancel-{mode}-{i}" for i in range(samples)]
    ready = [Path(f"{m}.ready") for m in marks]
    rec = tmp / "rec.py"
    rec.write_text(TERM_RECORDER)
    ids = push(fig, db, mode, *[f"exec {sys.executable} {rec} {m}" for m in marks])
    log = f"pg-cancel-{mode}.log"
    with supervisor(["--backend", "postgres", "-n", str(samples), *notify_args(mode)], tmp,
                    fig.jobq_env(db), log=log):
        wait_until(lambda: all(r.exists() for r in ready), 60, 0.05,
                   what=f"{samples} tasks running:\n{log_tail(tmp / log)}")
        if mode == "on":
            wait_until(lambda: listening(fig, db), 30, 0.05, what="the control LISTEN")
        out: dict[str, list[float]] = {"returned": [], "exec": []}
        for tid, mark in zip(ids, marks):
            time.sleep(RANDOM.uniform(0.1, 5.0))  # any phase of the 5 s control poll
            started = time.time()
            fig.ctl(db, "cancel", tid, "--reason", "bench", *notify_args(mode))
            returned = time.time()
            wait_until(partial(has_text, mark), 30, 0.005, what=f"the SIGTERM of {tid}")
            term = float(mark.read_text().split()[0])
            out["returned"].append(term - returned)
            out["exec"].append(term - started)
    return out


# --------------------------------------------------------------------------- logs -f
def follow_latency(fig: PgFigure, mode: str, lines: int) -> list[float]:
    """A task printing its time every FOLLOW_EVERY s, ``lines`` times, read by ``jobq-ctl
    logs -f`` started before the worker: read time minus print time of each line but the
    first 5 (the follower catching up with the task's start)."""
    tmp = fig.b.tmp
    db = fig.fresh_db(f"follow_{mode}", 0)
    [tid] = push(fig, db, mode, f"for i in $(seq 1 {lines}); do date +%s.%N; "
                 f"sleep {FOLLOW_EVERY}; done")
    env = {**os.environ, **fig.jobq_env(db)}
    follower = subprocess.Popen(
        [str(BIN / "jobq-ctl"), "logs", "-f", tid, "--backend", "postgres", *notify_args(mode)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    # the follower ends with the task; one that does not is killed (and fails below)
    killer = threading.Timer(lines * FOLLOW_EVERY + 60, follower.kill)
    killer.start()
    got: list[tuple[float, float]] = []
    try:
        with supervisor(["--backend", "postgres", *notify_args(mode)], tmp, fig.jobq_env(db),
                        log=f"pg-follow-{mode}.log"):
            assert follower.stdout is not None
            for line in follower.stdout:
                got.append((time.time(), float(line)))
            follower.wait(30)
    finally:
        killer.cancel()
        if follower.poll() is None:
            follower.kill()
            follower.wait(10)
    if len(got) != lines:
        raise BenchError(f"logs -f ({mode}) read {len(got)} of {lines} lines")
    return [read - printed for read, printed in got[5:]]


# --------------------------------------------------------------------------- flood
class RssPeak:
    """The supervisor's RSS, sampled every 20 ms on its own thread: (epoch, bytes)."""

    def __init__(self, pid: int) -> None:
        self.proc = psutil.Process(pid)
        self.samples: list[tuple[float, int]] = []
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, name="bench-rss")
        self.thread.start()

    def _run(self) -> None:  # the sampler thread
        while not self.done.wait(0.02):
            try:
                self.samples.append((time.time(), self.proc.memory_info().rss))
            except psutil.Error:
                return

    def peak(self, t0: float, t1: float) -> float:
        """MiB, the most sampled between ``t0`` and ``t1`` (epoch)."""
        return max((r for t, r in self.samples if t0 <= t <= t1), default=0) / 2**20

    def stop(self) -> None:
        self.done.set()
        self.thread.join(5)


def renewals(path: Path, t0: float, t1: float) -> tuple[list[float], int]:
    """The renewal round trips (s) that ended between ``t0`` and ``t1`` and the failed ones."""
    ok, failed = [], 0
    for line in path.read_text().splitlines():
        t, duration, good = line.split()
        if t0 <= float(t) <= t1:
            if good == "1":
                ok.append(float(duration))
            else:
                failed += 1
    return ok, failed


def flood_run(fig: PgFigure, mode: str, run: int, quiet_s: float,
              output: str = "store") -> dict[str, Any]:
    """SLEEPERS renewing leases on one worker, ``quiet_s`` seconds alone, then beside the
    flood until it ends (stored: until its output is complete): the renewals and the peak RSS
    of each window, the leases lost, the flood's stored size and ending.  ``output``:
    ``store`` (the output store on PostgreSQL) or ``local`` (``--task-output local``: the
    same pump and log lines, no store -- the reference that leaves the fleet layer out)."""
    tmp = fig.b.tmp
    db = fig.fresh_db(f"flood_{mode}_{output}", run)
    timings = tmp / f"pg-flood-{mode}-{output}-{run}.renewals"
    script = tmp / "pg-renewals.py"
    script.write_text(RENEWAL_RECORDER)
    sleepers = push(fig, db, mode, *["sleep 600"] * SLEEPERS)
    log = tmp / f"pg-flood-{mode}-{output}-{run}.log"

    def job(tid: str) -> tuple[Any, ...]:
        return fig.srv.admin("SELECT state, extract(epoch from started_at), "
                             "extract(epoch from ended_at) FROM jobq.jobs WHERE id = %s",
                             dbname=db, params=(tid,))[0]

    with supervisor(["--backend", "postgres", "-n", str(SLEEPERS + 1), *LEASE,
                     "--task-output-max", str(OUTPUT_MAX), "--task-output", output,
                     *notify_args(mode)], tmp,
                    fig.jobq_env(db), log=log.name,
                    prog=[str(BIN / "python"), str(script), str(timings)]) as proc:
        wait_until(lambda: all(job(t)[0] == "running" for t in sleepers), 60, 0.05,
                   what=f"{SLEEPERS} leases:\n{log_tail(log)}")
        wait_until(lambda: timings.exists() and len(timings.read_text().splitlines())
                   >= 2 * SLEEPERS, 30, 0.05, what="the renewals")
        rss = RssPeak(proc.pid)
        try:
            q0 = time.time()
            time.sleep(quiet_s)
            q1 = time.time()
            [flood] = push(fig, db, mode, FLOOD)
            wait_until(lambda: job(flood)[0] in ("succeeded", "failed") and (
                output != "store" or fig.srv.admin(
                    "SELECT count(*) FROM jobq.outputs WHERE task_id = %s AND complete",
                    dbname=db, params=(flood,))[0][0]), 900, 0.05,
                       what=f"the flood's end, its output complete:\n{log_tail(log)}")
            f1 = time.time()
        finally:
            rss.stop()
        state, f0, ended = job(flood)
        lost = [t for t in sleepers if job(t)[0] != "running"]
    stored, tail = fig.srv.admin(
        "SELECT o.size, (SELECT data FROM jobq.output_chunks c WHERE (c.queue, c.task_id, "
        "c.attempt) = (o.queue, o.task_id, o.attempt) ORDER BY pos DESC LIMIT 1) "
        "FROM jobq.outputs o WHERE o.task_id = %s AND o.complete", dbname=db,
        params=(flood,))[0] if output == "store" else (0, b"")
    quiet, quiet_failed = renewals(timings, q0, q1)
    busy, busy_failed = renewals(timings, float(f0), f1)
    if not quiet or not busy:
        raise BenchError(f"no renewals measured (quiet {len(quiet)}, flood {len(busy)})")
    return {"quiet": quiet, "flood": busy, "failed": quiet_failed + busy_failed,
            "lost": len(lost) + log.read_text(errors="replace").lower().count("lock lost"),
            "flood_state": state, "flood_s": float(ended) - float(f0),
            "stored_s": f1 - float(f0), "stored": int(stored),
            "marker": bytes(tail).endswith(
                b"(--task-output-max) ...]\n") and int(stored) > OUTPUT_MAX,
            "rss_quiet_mib": rss.peak(q0, q1), "rss_flood_mib": rss.peak(float(f0), f1)}


def ms(values: list[float], p: float) -> str:
    return f"{pct(values, p) * 1000:.0f}"


def fig_pg_fleet(b: Bench) -> None:
    """Acceptance 3 and 4 of issue 29: cancel -> SIGTERM and ``logs -f`` latency with NOTIFY
    on and off; renewals, output and RSS beside a 150 MB flood."""
    samples = 5 if b.quick else 10
    lines = 30 if b.quick else 60
    quiet_s = 5.0 if b.quick else 15.0
    with production_server() as srv:
        fig = PgFigure(b, srv)
        cancel = {m: cancel_latency(fig, m, samples) for m in MODES}
        follow = {m: follow_latency(fig, m, lines) for m in MODES}
        floods, local = [], []
        for i in range(b.runs):  # interleaved: a drift of the machine hits both alike
            floods.append(flood_run(fig, "on", i, quiet_s))
            local.append(flood_run(fig, "on", i, quiet_s, output="local"))

    def summary(f: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in f.items() if k not in ("quiet", "flood")} | {
            "quiet_p50": pct(f["quiet"], 50), "quiet_p99": pct(f["quiet"], 99),
            "flood_p50": pct(f["flood"], 50), "flood_p99": pct(f["flood"], 99),
            "quiet_n": len(f["quiet"]), "flood_n": len(f["flood"])}

    b.results.update(pg_fleet_cancel_s=cancel, pg_fleet_follow_s=follow,
                     pg_fleet_flood=[summary(f) for f in floods],
                     pg_fleet_flood_local=[summary(f) for f in local])

    def p50_p90(lat: list[float]) -> str:
        return f"p50 {ms(lat, 50)} ms, p90 {ms(lat, 90)} ms"

    off = "notify off (5 s control, 1 s poll)"
    on_ok = pct(cancel["on"]["returned"], 50) <= 1.0
    b.row(f"PostgreSQL cancel -> SIGTERM, {samples} tasks",
          f"notify on: {p50_p90(cancel['on']['returned'])} (from exec "
          f"{p50_p90(cancel['on']['exec'])})",
          f"{off}: {p50_p90(cancel['off']['returned'])}",
          "target median <= 1 s: " + ("met" if on_ok else "MISSED"))
    on_ok = pct(follow["on"], 50) <= 0.5
    b.row(f"PostgreSQL logs -f line latency, {lines - 5} lines",
          f"notify on: {p50_p90(follow['on'])}", f"{off}: {p50_p90(follow['off'])}",
          "target median <= 0.5 s: " + ("met" if on_ok else "MISSED"))
    quiet = [d for f in floods + local for d in f["quiet"]]
    busy = [d for f in floods for d in f["flood"]]
    beside_local = [d for f in local for d in f["flood"]]
    lost = sum(f["lost"] + f["failed"] for f in floods + local)
    # The noise: how far one run's p99 lands from another's in the same configuration.  The
    # store changes nothing within it when its runs' median p99 is inside the span of the
    # local runs' p99s (the same flood, the same pump and log lines, no store).
    run_p99 = [pct(f["flood"], 99) for f in floods]
    local_p99 = [pct(f["flood"], 99) for f in local]
    within = statistics.median(run_p99) <= max(local_p99)

    def each(values: list[float]) -> str:
        return "/".join(f"{v * 1000:.0f}" for v in values)

    b.row(f"PostgreSQL renewals beside a {FLOOD_MB} MB flood",
          f"stored: p50 {ms(busy, 50)} ms, p99 {ms(busy, 99)} ms ({len(busy)} renewals; "
          f"p99 per run {each(run_p99)} ms)",
          f"the same flood, --task-output local: p50 {ms(beside_local, 50)} ms, p99 "
          f"{ms(beside_local, 99)} ms (per run {each(local_p99)}); no flood: p50 "
          f"{ms(quiet, 50)} ms, p99 {ms(quiet, 99)} ms ({len(quiet)}); {SLEEPERS} leases, "
          f"{' '.join(LEASE)}",
          ("the store adds nothing beyond the runs' spread" if within else
           "the store raises the p99 beyond the runs' spread") + "; "
          + (f"{lost} lost or failed" if lost else "no lease lost or failed"))
    capped = all(f["marker"] and f["flood_state"] == "succeeded" for f in floods)
    b.row(f"PostgreSQL {FLOOD_MB} MB flood: stored, supervisor RSS",
          f"{min(f['stored'] for f in floods) / 2**20:.0f} MiB + marker, stored "
          f"{statistics.median([f['stored_s'] for f in floods]):.1f} s after its start; "
          f"peak RSS {max(f['rss_flood_mib'] for f in floods):.0f} MiB",
          f"task ran {statistics.median([f['flood_s'] for f in floods]):.1f} s; RSS "
          f"without the flood: {max(f['rss_quiet_mib'] for f in floods):.0f} MiB",
          f"--task-output-max {OUTPUT_MAX >> 20}M: " + ("capped, marker" if capped
                                                        else "NOT CAPPED"))
