"""Issue 28's PostgreSQL figure: drains side by side on one real server, and what they cost it.

One PostgreSQL 15 server for the whole figure, started here with the tests' ``PgServer``
(``tests/postgres/server.py``) and then set as production runs it: fsync, synchronous commit
and full-page writes on, 128 MB of shared buffers, ``pg_stat_statements`` loaded.  Clients
connect over loopback TCP with a password.  Each round gives every side a fresh database,
pushes ``n`` ``true`` tasks (not timed) and times its command from exec to exit:

* the raw loop (bench_pg_peers.RAW_LOOP): 4 threads, one row per transaction;
* ``jobq-supervisor --backend postgres -n 4 --exit-when-empty``, default options;
* PgQueuer and Procrastinate (bench_pg_peers), 4 tasks at once, in venvs of their own.

Sides alternate order every round and each ratio is the median of the per-round ratios
(bench_dispatch.paired_runs).  Around each timed run the server's counters are read
(``Probe``): statements (pg_stat_statements, top level, BEGIN/COMMIT included),
transactions (pg_stat_database), WAL bytes (pg_current_wal_lsn) and the server's CPU time
(the postmaster and every process it forked, reaped or alive).  Then, on the same server:
an idle worker for a window (cost per idle worker-hour, connections it holds), 100,000
tasks pushed and run through (the jobs table's size), and the fleet size the measured costs
extrapolate to (bench_pg_fleet.py).  Everything runs on the bench's main thread, except the
connection sampler's thread.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from typing import Any

import bench_pg_peers as peers
import psutil
from bench_dispatch import paired_runs, supervisor_drain, timed_exit, verdict
from bench_pg_fleet import fleet_size
from benchlib import BIN, REPO, Bench, BenchError, byte_compile, expect_exit, supervisor, wait_until

# As a production server runs (PgServer's own settings are the tests': fsync off).
PRODUCTION = {"fsync": "on", "synchronous_commit": "on", "full_page_writes": "on",
              "shared_buffers": "'128MB'", "max_connections": "200",
              "shared_preload_libraries": "'pg_stat_statements'"}
SIDES = ("raw", "jobq", "pgqueuer", "procrastinate")


@contextmanager
def production_server() -> Iterator[Any]:
    """A started ``PgServer`` with the PRODUCTION settings (ALTER SYSTEM, then a restart),
    closed (killed, its folder removed) however the block ends."""
    sys.path.insert(0, str(REPO))
    from tests.postgres.server import PgServer, why_no_server

    why = why_no_server()
    if why:
        raise BenchError(why)
    srv = PgServer()
    try:
        srv.start()
        for key, value in PRODUCTION.items():
            srv.admin(f"ALTER SYSTEM SET {key} = {value}")
        srv.restart()
        srv.admin("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        yield srv
    finally:
        srv.close()


class Probe:
    """The server's counters for one database, read before and after a run."""

    def __init__(self, srv: Any, db: str) -> None:
        self.srv, self.db = srv, db
        self.before: dict[str, float] = {}

    def _server_cpu(self) -> float:
        try:
            pm = psutil.Process(self.srv.pid)
            t = pm.cpu_times()
            total = t.user + t.system + t.children_user + t.children_system
            for child in pm.children():  # alive: not yet in children_user/system
                try:
                    c = child.cpu_times()
                    total += c.user + c.system
                except psutil.NoSuchProcess:  # reaped since: counted above next time
                    pass
        except psutil.Error as exc:
            raise BenchError(f"server CPU time unreadable: {exc!r}") from None
        return total

    def read(self) -> dict[str, float]:
        stmts = self.srv.admin(
            "SELECT coalesce(sum(calls), 0) FROM pg_stat_statements s JOIN pg_database d "
            "ON d.oid = s.dbid WHERE d.datname = %s", params=(self.db,))[0][0]
        xacts, wal = self.srv.admin(
            "SELECT xact_commit + xact_rollback, pg_current_wal_lsn() - '0/0'::pg_lsn "
            "FROM pg_stat_database WHERE datname = %s", params=(self.db,))[0]
        return {"statements": float(stmts), "transactions": float(xacts),
                "wal_bytes": float(wal), "server_cpu_s": self._server_cpu()}

    def start(self) -> None:
        self.srv.admin("SELECT pg_stat_statements_reset()")
        self.before = self.read()

    def stop(self) -> dict[str, float]:
        """The counters' deltas, once every connection to the database is gone (a backend
        reports its transactions when it exits)."""
        wait_until(lambda: not self.connections(), 30, 0.05,
                   what=f"the connections to {self.db} to close")
        after = self.read()
        return {k: after[k] - self.before[k] for k in after}

    def connections(self) -> int:
        rows = self.srv.admin("SELECT count(*) FROM pg_stat_activity WHERE datname = %s",
                              params=(self.db,))
        return int(rows[0][0])

    def top_statements(self, limit: int = 12) -> list[dict[str, Any]]:
        rows = self.srv.admin(
            "SELECT calls, round(total_exec_time::numeric, 1), left(query, 160) "
            "FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid "
            "WHERE d.datname = %s ORDER BY calls DESC LIMIT %s", params=(self.db, limit))
        return [{"calls": int(c), "ms": float(ms), "query": q} for c, ms, q in rows]


class PgFigure:
    """The rounds of one figure on one server: each side's tasks/s and costs."""

    def __init__(self, b: Bench, srv: Any) -> None:
        self.b, self.srv = b, srv
        self.costs: dict[str, list[dict[str, float]]] = {s: [] for s in SIDES}
        self.top: list[dict[str, Any]] = []
        self.lost: Counter[str] = Counter()

    def fresh_db(self, side: str, i: int) -> str:
        return self.srv.create_database(f"{side}_r{i}")

    def jobq_env(self, db: str) -> dict[str, str]:
        return {"JOBQ_POSTGRES_URL": self.srv.url(db)}

    def ctl(self, db: str, *args: str) -> str:
        """``jobq-ctl ARGS --backend postgres`` on ``db``: its output; raises unless it
        exits 0."""
        done = subprocess.run([str(BIN / "jobq-ctl"), *args, "--backend", "postgres"],
                              env={**os.environ, **self.jobq_env(db)}, capture_output=True,
                              text=True, timeout=1800)
        if done.returncode != 0:
            raise BenchError(f"jobq-ctl {args[0]} failed ({done.returncode}): "
                             f"{done.stderr[-2000:]}")
        return done.stdout

    def push(self, db: str, n: int) -> None:
        """``n`` ``true`` tasks with ``jobq-ctl push --file`` (which creates the schema)."""
        tasks = self.b.tmp / "pg-tasks.txt"
        tasks.write_text("true\n" * n)
        self.ctl(db, "push", "--file", str(tasks))

    def measured(self, side: str, db: str, run: Callable[[], float]) -> float:
        probe = Probe(self.srv, db)
        probe.start()
        rate = run()
        self.costs[side].append(probe.stop())
        if side == "jobq":
            self.top = probe.top_statements()
        return rate

    def side(self, side: str, i: int) -> float:
        """One timed run of ``side`` in round ``i``: tasks/s from exec to exit."""
        n, tmp = self.b.n, self.b.tmp
        db = self.fresh_db(side, i)
        if side == "jobq":
            self.push(db, n)
            return self.measured(side, db, partial(
                supervisor_drain, tmp, ["--backend", "postgres", "-n", "4"],
                self.jobq_env(db), n, f"pg-jobq-{i}.log", self.lost))
        if side == "raw":
            drain = peers.raw_loop(self.srv, db, n, tmp, sys.executable)
        else:
            drain = getattr(peers, side)(self.srv, db, n, tmp)

        def timed() -> float:
            return n / timed_exit(drain.cmd, tmp, f"pg-{side}-{i}.log", drain.env)

        rate = self.measured(side, db, timed)
        drain.check()
        return rate

    def per_task(self, side: str) -> dict[str, float]:
        return {k: statistics.median(c[k] for c in self.costs[side]) / self.b.n
                for k in self.costs[side][0]}


def idle_worker(fig: PgFigure, window: float) -> dict[str, float]:
    """An idle jobq-supervisor -n 4 on an empty queue: its costs over ``window`` seconds
    (from 5 s after its start: start-up is not idling), per hour; the connections it holds."""
    db = fig.fresh_db("idle", 0)
    fig.ctl(db, "migrate")  # the schema, as any queue has
    probe = Probe(fig.srv, db)
    with supervisor(["--backend", "postgres", "-n", "4"], fig.b.tmp, fig.jobq_env(db),
                    log="pg-idle.log") as proc:
        time.sleep(5.0)
        if proc.poll() is not None:
            raise BenchError(f"idle worker exited {proc.returncode}")
        probe.start()
        t0 = time.monotonic()
        time.sleep(window)
        conns = probe.connections()
        after = probe.read()
        seconds = time.monotonic() - t0
    scale = 3600.0 / seconds
    return {"statements_per_hour": (after["statements"] - probe.before["statements"]) * scale,
            "wal_bytes_per_hour": (after["wal_bytes"] - probe.before["wal_bytes"]) * scale,
            "server_cpu_s_per_hour": (after["server_cpu_s"] - probe.before["server_cpu_s"])
            * scale, "connections": conns, "window_s": seconds}


def table_after(fig: PgFigure, total: int) -> dict[str, float]:
    """``total`` tasks pushed and run through by one worker -n 4 in a fresh database, then
    the jobs table's size; the most connections the worker held while it ran (sampled)."""
    db = fig.fresh_db("table", 0)
    t0 = time.monotonic()
    fig.push(db, total)
    pushed_s = time.monotonic() - t0
    probe = Probe(fig.srv, db)
    peak = [0]
    done = threading.Event()

    def sample() -> None:  # the sampler thread: connections while the worker runs
        while not done.wait(0.2):
            peak[0] = max(peak[0], probe.connections())

    sampler = threading.Thread(target=sample, name="bench-pg-conns")
    sampler.start()
    try:
        t0 = time.monotonic()
        with supervisor(["--backend", "postgres", "-n", "4", "--exit-when-empty"],
                        fig.b.tmp, fig.jobq_env(db), log="pg-table.log",
                        stop_timeout=60) as proc:
            expect_exit(proc, 3600, fig.b.tmp / "pg-table.log")
        ran_s = time.monotonic() - t0
    finally:
        done.set()
        sampler.join()
    fig.srv.admin("ANALYZE jobq.jobs", dbname=db)
    (heap, idx, total_bytes, rows, dead) = fig.srv.admin(
        "SELECT pg_relation_size(c.oid), pg_indexes_size(c.oid), pg_total_relation_size(c.oid),"
        " (SELECT count(*) FROM jobq.jobs), coalesce(s.n_dead_tup, 0) FROM pg_class c "
        "LEFT JOIN pg_stat_user_tables s ON s.relid = c.oid WHERE c.oid = 'jobq.jobs'::regclass",
        dbname=db)[0]
    return {"tasks": total, "push_s": pushed_s, "run_s": ran_s, "heap_bytes": heap,
            "index_bytes": idx, "total_bytes": total_bytes, "rows": rows, "dead_rows": dead,
            "peak_connections": peak[0]}


def fig_postgres(b: Bench) -> None:
    """Acceptance 5 of issue 28: the drain next to the raw loop, PgQueuer and Procrastinate;
    costs per task and per idle worker-hour; the jobs table after 100,000 tasks; a fleet."""
    byte_compile()  # as installed: the peers' packages are byte-compiled by pip too
    with production_server() as srv:
        fig = PgFigure(b, srv)

        def sides(i: int) -> dict[str, Callable[[], float]]:
            return {s: partial(fig.side, s, i) for s in SIDES}

        runs, discarded = paired_runs(b.runs, sides, "drain_postgres")
        idle = idle_worker(fig, 10.0 if b.quick else 20.0)
        table = table_after(fig, 10_000 if b.quick else 100_000)
    rate = {s: statistics.median(r[s] for r in runs) for s in SIDES}
    ratio = {s: statistics.median(r["jobq"] / r[s] for r in runs) for s in SIDES}
    cost = {s: fig.per_task(s) for s in SIDES}
    fleet = fleet_size(cost["jobq"], idle, table["peak_connections"])
    b.results.update(drain_postgres=runs, drain_postgres_discarded=discarded,
                     postgres_cost_per_task=cost, postgres_idle=idle, postgres_table=table,
                     postgres_top_statements=fig.top, postgres_fleet=fleet,
                     postgres_ratios=ratio)
    b.row(f"PostgreSQL drain, {b.n} true, -n 4 (exec -> exit)",
          f"{rate['jobq']:.0f} tasks/s" + (f" ({len(discarded)} of {b.runs} runs discarded)"
                                           if discarded else ""),
          f"raw 1-row SKIP LOCKED + bash -c true + delete, 4 threads: {rate['raw']:.0f}/s; "
          f"PgQueuer {peers.PGQUEUER_VERSION}: {rate['pgqueuer']:.0f}/s; Procrastinate "
          f"{peers.PROCRASTINATE_VERSION}: {rate['procrastinate']:.0f}/s (4 at once, exec -> exit)",
          f"{verdict(ratio['raw'], 0.8)} raw, {verdict(ratio['pgqueuer'], 2.0)} PgQueuer, "
          f"{verdict(ratio['procrastinate'], 2.0)} Procrastinate")

    def per(s: str) -> str:
        c = cost[s]
        return (f"{c['statements']:.1f} stmts, {c['transactions']:.1f} xacts, "
                f"{c['wal_bytes'] / 1024:.1f} KiB WAL, {c['server_cpu_s'] * 1000:.2f} ms CPU")

    b.row("PostgreSQL cost per task, -n 4 (server side)", per("jobq"),
          f"raw loop: {per('raw')}; PgQueuer: {per('pgqueuer')}; Procrastinate: "
          f"{per('procrastinate')}", "statements: pg_stat_statements (BEGIN/COMMIT count)")
    b.row("PostgreSQL idle worker -n 4, per hour",
          f"{idle['statements_per_hour']:.0f} stmts, "
          f"{idle['wal_bytes_per_hour'] / 1024:.0f} KiB WAL, "
          f"{idle['server_cpu_s_per_hour']:.1f} CPU-s",
          f"{idle['window_s']:.0f} s window x {3600 / idle['window_s']:.0f}; "
          f"{idle['connections']:.0f} connections held", "")
    b.row(f"PostgreSQL jobs table after {table['tasks']:,.0f} tasks",
          f"{table['total_bytes'] / 2**20:.1f} MiB (heap {table['heap_bytes'] / 2**20:.1f}, "
          f"indexes {table['index_bytes'] / 2**20:.1f}), {table['rows']:,.0f} rows",
          f"pushed in {table['push_s']:.0f} s, run through by one -n 4 worker in "
          f"{table['run_s']:.0f} s ({table['tasks'] / table['run_s']:.0f}/s, "
          f"<= {table['peak_connections']:.0f} connections); --retention 7 d keeps every "
          f"finished row", f"{table['total_bytes'] / table['tasks']:.0f} B per task kept")
    b.row("PostgreSQL fleet, one 2-core server, 60 s tasks", fleet["summary"],
          fleet["assumptions"], "extrapolated")
