"""The fleet one PostgreSQL server carries, extrapolated from costs bench_postgres.py measured.

A model, not a measurement: its assumptions are constants here and printed with the result.
Runs on the bench's main thread.
"""

from __future__ import annotations

from typing import Any

TASK_S = 60.0  # each task runs this long
SLOTS = 4  # -n 4 per worker, every slot busy
CORES = 2.0  # the server's cores ...
BUSY = 0.5  # ... at most this busy with queue work (headroom for the rest)
LEASE_S, RENEW_S = 300.0, 100.0  # the default lease and its renew interval (lock/3)
MAX_CONNECTIONS = 100  # PostgreSQL's default, 3 of them reserved for superusers
RESERVED = 3


def fleet_size(per_task: dict[str, float], idle: dict[str, float],
               busy_connections: float | None = None) -> dict[str, Any]:
    """Workers one server carries for TASK_S-second tasks, from the server CPU a task costs
    (``per_task``: a whole drain's costs divided by its tasks; receive, start, settle) and
    an idle worker's cost per hour (``idle``), which every worker is charged too (its
    listener and polls: an overestimate for a busy worker, which does not poll).  The
    connections the workers hold are counted separately: beyond ``max_connections`` they
    need PgBouncer, whatever the CPU."""
    renewals = int(TASK_S // RENEW_S)  # 0 for a 60 s task with the 5 min lease
    stmt_cpu = per_task["server_cpu_s"] / max(per_task["statements"], 1.0)
    task_cpu = per_task["server_cpu_s"] + renewals * stmt_cpu
    worker_cpu = SLOTS / TASK_S * task_cpu + idle["server_cpu_s_per_hour"] / 3600.0
    workers = int(CORES * BUSY / worker_cpu)
    tasks_per_s = workers * SLOTS / TASK_S
    conns = max(idle["connections"], busy_connections or 0.0)
    by_conns = int((MAX_CONNECTIONS - RESERVED) // max(conns, 1.0))
    wal = tasks_per_s * per_task["wal_bytes"] + workers * idle["wal_bytes_per_hour"] / 3600
    stmts = tasks_per_s * per_task["statements"] + workers * idle["statements_per_hour"] / 3600
    return {
        "workers": workers, "tasks_per_s": tasks_per_s, "slots": workers * SLOTS,
        "wal_kib_per_s": wal / 1024, "statements_per_s": stmts,
        "connections_per_worker": conns, "workers_within_max_connections": by_conns,
        "summary": f"~{workers:,} workers -n 4 ({workers * SLOTS:,} tasks running, "
                   f"{tasks_per_s:,.0f} tasks/s, {stmts:,.0f} stmts/s, "
                   f"{wal / 1024:.0f} KiB/s WAL); {conns:.0f} connections each: "
                   f"{by_conns} workers fit max_connections={MAX_CONNECTIONS}, PgBouncer "
                   "beyond",
        "assumptions": f"{TASK_S:.0f} s tasks, every slot busy; server CPU per task as "
                       f"measured ({per_task['server_cpu_s'] * 1000:.2f} ms) plus "
                       f"{renewals} renewals (lease {LEASE_S:.0f} s, renewed every "
                       f"{RENEW_S:.0f} s); every worker also charged an idle worker's "
                       f"cost; {CORES:.0f} cores at most {BUSY:.0%} busy; disk keeps up "
                       "with the WAL; CPU measured on this VM with the workers beside it",
    }
