"""jobq-supervisor benchmarks: each figure next to its reference measured in the same run.

Run through ``scripts/bench [--quick] [--json]``; ``--fleet`` runs the fleet model instead
(bench_fleet.py: calls per task, cost per million tasks, workers per queue).  Everything talks
to loopback only; Azurite is started here on a free port and killed by its PID.  Medians over
several runs.

A figure is a function of a ``Bench`` (benchlib.py) that measures (bench_measure.py) and adds
its results and row(s); FIGURES lists them in table order.  A wait that times out stops the
bench with its reason instead of becoming a number.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import psutil
from bench_dashboard import LISTED, PAGE_NO, azure_calls, render_times, task_page_times
from bench_dispatch import fig_drain_azurite, fig_drain_servicebus
from bench_fleet import fleet, print_fleet
from bench_measure import (
    azurite_lock_loss,
    control_calls,
    dispatch_latency,
    escalation_lateness,
    overhead,
    raw_spawn_rate,
    sigterm_forwarding,
    sqlite_lock_loss,
    sqlite_throughput,
)
from bench_output import blob_store_rate, output_rate, store_rate
from bench_pg_fleet_layer import fig_pg_fleet
from bench_postgres import fig_postgres
from bench_receive import receive_time
from bench_rtt import fig_drain_servicebus_rtt
from bench_startup import fig_startup
from benchlib import Azurite, Bench, Figure, Row, pct


# --------------------------------------------------------------------------- figures
def paired_medians(pairs: list[tuple[float, float]]) -> tuple[float, float, float]:
    """(reference, measurement) pairs -> medians of each and of the per-pair ratios."""
    return (statistics.median(r for r, _ in pairs), statistics.median(m for _, m in pairs),
            statistics.median(m / r for r, m in pairs))


def alternated(b: Bench, measure: Callable[[bool], float]) -> list[tuple[float, float]]:
    """(reference, measurement) pairs of ``measure(False)`` and ``measure(True)``, the two
    swapping places each pair: the VM's spawn rate drifts by more than the few per cent an
    on/off figure is about, and a fixed order would hand that drift to one side."""
    pairs = []
    for i in range(3 if b.quick else 2 * b.runs):
        got = {on: measure(on) for on in ((False, True) if i % 2 == 0 else (True, False))}
        pairs.append((got[False], got[True]))
    return pairs


def fig_sqlite_throughput(b: Bench) -> None:
    # Reference and supervisor alternate, and the ratio is taken per pair: this VM's
    # raw spawn rate itself drifts by +-20 % over minutes.
    pairs = [(raw_spawn_rate(b.n), sqlite_throughput(b.tmp, b.n)) for _ in range(b.runs)]
    raw, sq, ratio = paired_medians(pairs)
    b.results.update(raw_spawn_rate=raw, sqlite_throughput=sq, sqlite_ratio=ratio,
                     sqlite_ratios=[s / r for r, s in pairs])
    b.row("SQLite throughput, -n 4", f"{sq:.0f} tasks/s",
          f"raw bash -c true spawn, 4 threads: {raw:.0f}/s", f"{ratio:.0%} (target >= 50%)")


def fig_azurite_lock_loss(b: Bench) -> None:
    assert b.azurite is not None
    margins = [azurite_lock_loss(b.tmp, b.azurite.conn_str, b.azurite.port, f"ll{i}")
               for i in range(b.runs)]
    b.results["azurite_lock_loss_margin_s"] = margins
    b.row("Lock loss, Azurite black-holed", f"margin min {min(margins):.2f} s",
          "kill before the message is visible again",
          "all before expiry" if min(margins) > 0 else "LATE")


def fig_dispatch_latency(b: Bench) -> None:
    lat: list[float] = []
    for run in range(b.runs):
        lat += dispatch_latency(b.tmp, 10 if b.quick else 20, run)
    b.results.update(dispatch_latency_p50=pct(lat, 50), dispatch_latency_p99=pct(lat, 99))
    b.row("Dispatch latency (idle worker)",
          f"p50 {pct(lat, 50) * 1000:.0f} ms, p99 {pct(lat, 99) * 1000:.0f} ms",
          "push -> process start")


def fig_overhead(b: Bench) -> None:
    for k in (4, 64) if b.quick else (4, 64, 1000):
        # One supervisor per size, CPU measured over `runs` consecutive 10 s windows
        # (starting 1,000 tasks again for each would measure start-up, not running).
        cpus, rss = overhead(b.tmp, k, 5.0 if b.quick else 10.0, b.runs)
        cpu = statistics.median(cpus)
        b.results[f"overhead_{k}"] = {"cpu_s_per_s": cpu, "cpu_s_per_s_windows": cpus,
                                      "rss_mib": rss}
        target = 0.01 if k == 4 else (0.05 if k == 1000 else None)
        b.row(f"Supervisor overhead, {k} sleeping tasks",
              f"{cpu:.4f} CPU-s/s (max {max(cpus):.4f}), {rss:.0f} MiB RSS",
              "", f"target <= {target}" if target else "")


def fig_control_plane(b: Bench) -> None:
    # Off and on alternate (alternated), and the ratio is taken per pair.
    pairs = alternated(b, lambda on: sqlite_throughput(
        b.tmp, b.n, ("--control", "auto" if on else "off")))
    off, on, ratio = paired_medians(pairs)
    idle = {}
    for mode in ("off", "auto"):
        cpus, _ = overhead(b.tmp, 4, 10.0 if b.quick else 15.0, b.runs, ("--control", mode))
        idle[mode] = statistics.median(cpus)
    # From the second heartbeat, a multiple of both default intervals (15 s, 5 s): the count
    # scales to an hour without a phase error.  The purge runs once an hour: not in it.
    window = 30.0 if b.quick else 60.0
    calls = Counter(name for _, name in control_calls(b.tmp, window))
    per_hour = sum(calls.values()) * 3600 / window
    b.results.update(control_throughput_off=off, control_throughput_on=on,
                     control_throughput_ratio=ratio,
                     control_throughput_ratios=[a / o for o, a in pairs],
                     control_idle_cpu_off=idle["off"], control_idle_cpu_on=idle["auto"],
                     control_calls_window_s=window, control_calls=dict(calls),
                     control_calls_per_hour=per_hour)
    b.row("Control plane on vs off (SQLite)",
          f"throughput {ratio:.0%} of off, idle CPU {idle['auto']:.4f} vs "
          f"{idle['off']:.4f} CPU-s/s",
          f"--control off: {off:.0f} tasks/s (-n 4); 4 sleeping tasks",
          "target >= 95%, <= 0.01")
    b.row("Control store calls, idle worker", f"{per_hour:.0f} per hour + 1 purge",
          ", ".join(f"{n} {name}" for name, n in sorted(calls.items()))
          + f" in {window:.0f} s (15 s heartbeat, 5 s poll)", "target < 1000")


def fig_lifeline_feed(b: Bench) -> None:
    # The lifeline's deadline feed (kill before expiry with a frozen supervisor) on and off,
    # alternating and swapping places each pair, the ratio taken per pair, as above.
    pairs = alternated(b, lambda on: sqlite_throughput(
        b.tmp, b.n, env={"JOBQ_LIFELINE_DEADLINES": "1" if on else "0"}))
    off, on, ratio = paired_medians(pairs)
    b.results.update(lifeline_feed_off=off, lifeline_feed_on=on, lifeline_feed_ratio=ratio,
                     lifeline_feed_ratios=[a / o for o, a in pairs])
    b.row("Lifeline deadline feed on vs off (SQLite)", f"throughput {ratio:.0%} of off",
          f"feed off: {off:.0f} tasks/s, on: {on:.0f} (-n 4)", "target: within noise (~5%)")


def fig_sigterm_forwarding(b: Bench) -> None:
    fw: list[float] = []
    for _ in range(b.runs):
        fw += sigterm_forwarding(b.tmp, 32)
    b.results.update(sigterm_p50=pct(fw, 50), sigterm_p99=pct(fw, 99))
    b.row("SIGTERM forwarding, 32 tasks",
          f"p50 {pct(fw, 50) * 1000:.1f} ms, p99 {pct(fw, 99) * 1000:.1f} ms",
          "supervisor SIGTERM -> task handler", "target p99 <= 50 ms")


def fig_escalation(b: Bench) -> None:
    esc = [escalation_lateness(b.tmp) for _ in range(b.runs)]
    b.results["escalation_late_s"] = esc
    b.row("Kill escalation (kill-timeout 1 s)",
          f"late by median {statistics.median(esc) * 1000:.0f} ms, max {max(esc) * 1000:.0f} ms",
          "SIGKILL - (SIGTERM + timeout)", "target <= 100 ms")


def fig_sqlite_lock_loss(b: Bench) -> None:
    ll = [sqlite_lock_loss(b.tmp) for _ in range(b.runs)]
    b.results["sqlite_lock_loss"] = [{"reaction_s": a, "margin_s": m} for a, m in ll]
    b.row("Lock loss, SQLite locked",
          f"reaction {statistics.median(a for a, _ in ll) * 1000:.0f} ms, "
          f"margin min {min(m for _, m in ll):.2f} s",
          "deadline -> group dead; LockedUntil - death",
          "all before expiry" if min(m for _, m in ll) > 0 else "LATE")


def fig_output_rate(b: Bench) -> None:
    r = output_rate(sys.executable, b.tmp, 200_000 if b.quick else 1_000_000)
    b.results["output_rate"] = r
    for where in ("file", "pipe"):
        b.row(f"Task output logged, into a {where}",
              f"{r[f'supervisor_{where}_lines_per_s'] / 1000:.0f}k lines/s, "
              f"{r[f'supervisor_{where}_mb_per_s']:.0f} MB/s",
              f"cat of the same output: {r[f'cat_{where}_lines_per_s'] / 1000:.0f}k lines/s, "
              f"{r[f'cat_{where}_mb_per_s']:.0f} MB/s",
              f"{r[f'supervisor_{where}_logged_fraction'] * 100:.0f}% logged, rest counted")


def fig_output_store(b: Bench) -> None:
    # As the control plane's figure: modes alternate, ratio per pair.
    pairs = alternated(b, lambda store: sqlite_throughput(
        b.tmp, b.n, ("--task-output", "store" if store else "local")))
    local, store, ratio = paired_medians(pairs)
    rate = store_rate(sys.executable, b.tmp, 100 if b.quick else 500)
    b.results.update(output_store_throughput_local=local, output_store_throughput_store=store,
                     output_store_throughput_ratio=ratio,
                     output_store_throughput_ratios=[s / lo for lo, s in pairs],
                     output_store_rate=rate)
    b.row("Output store on vs local (SQLite)", f"throughput {ratio:.0%} of local",
          f"--task-output local: {local:.0f} tasks/s (-n 4)", "target >= 90%")
    b.row("Task output stored, files store",
          f"{rate['store_mb_per_s']:.0f} MB/s, {rate['store_stored_fraction']:.0%} stored",
          f"cat of the same {rate['store_mb']:.0f} MB into a file: "
          f"{rate['cat_file_mb_per_s']:.0f} MB/s", "")


def fig_output_store_blob(b: Bench) -> None:
    # One worker on Storage Queue, its control store and output store on one Azurite (its
    # own, with blob and table: the shared one serves queues only).
    rate = blob_store_rate(sys.executable, b.tmp, 100 if b.quick else 500)
    b.results.update(output_store_blob_rate=rate)
    b.row("Task output stored, Azurite blob",
          f"{rate['blob_mb_per_s']:.0f} MB/s, {rate['blob_stored_fraction']:.0%} stored",
          f"cat of the same {rate['blob_mb']:.0f} MB into a file: "
          f"{rate['cat_file_mb_per_s']:.0f} MB/s", "Azurite on loopback, not Azure")


def fig_dashboard(b: Bench) -> None:
    r = render_times(b.tmp)
    b.results["dashboard_render"] = r
    worst = max(p["median_ms"] for p in r.values())
    b.row("Dashboard render, overview / workers",
          f"{r['/']['median_ms']:.0f} / {r['/workers']['median_ms']:.0f} ms median "
          f"(max {r['/']['max_ms']:.0f} / {r['/workers']['max_ms']:.0f})",
          "10,000 pending, 1,000 running, 50 workers (SQLite)",
          "target <= 300 ms" + (" MISSED" if worst > 300 else ""))


def fig_task_pages(b: Bench) -> None:
    r = task_page_times(b.tmp)
    b.results["dashboard_task_pages"] = r
    worst = max(p["median_ms"] for p in r.values())
    b.row(f"Tasks page {PAGE_NO}: all / failed / one worker; text search",
          " / ".join(f"{r[k]['median_ms']:.0f}" for k in ("all", "failed", "worker"))
          + f"; {r['text']['median_ms']:.0f} ms median",
          f"{LISTED:,} tasks, 100 a page by keyset (SQLite)",
          "target < 300 ms" + (" MISSED" if worst >= 300 else ""))


def fig_dashboard_azure_calls(b: Bench) -> None:
    r = azure_calls(b.tmp)
    b.results["dashboard_azure_calls"] = r
    m = r["per_minute"]
    b.row("Dashboard storage calls per minute, one open page (Azure)",
          f"overview {m['overview']}, workers {m['workers']}, failed {m['failed']}, task page "
          f"{m['task page (output being written)']} while output is written "
          f"({m['task page (output complete)']} after)",
          f"+ {m['sampler (one per dashboard)']} for the sampler, per dashboard", "")


def fig_receive_depth(b: Bench) -> None:
    # Alternating depths, ratio per pair, as the throughput figures.
    deep = 20_000 if b.quick else 100_000
    pairs = [(receive_time(b.tmp, 1000), receive_time(b.tmp, deep)) for _ in range(b.runs)]
    shallow_s, deep_s, ratio = paired_medians(pairs)
    b.results.update(receive_s_at_1000=shallow_s, receive_s_deep=deep_s, receive_depth=deep,
                     receive_ratios=[d / s for s, d in pairs])
    b.row(f"SQLite receive, {deep:,} pending (priorities 0-9)", f"{deep_s * 1e6:.0f} us",
          f"at 1,000 pending: {shallow_s * 1e6:.0f} us", f"{ratio:.2f}x (target <= 2x)")


# The table's rows, in order.  Consecutive Azurite figures share one Azurite.
FIGURES = [
    Figure(fig_sqlite_throughput),
    Figure(fig_drain_servicebus),  # its own broker process, no Azurite
    Figure(fig_drain_servicebus_rtt),  # the same through a ~10 ms round trip
    Figure(fig_drain_azurite, azurite=True),  # issue 19's whole-process drains
    Figure(fig_azurite_lock_loss, azurite=True),
    Figure(fig_dispatch_latency),
    Figure(fig_overhead),
    Figure(fig_control_plane),
    Figure(fig_lifeline_feed),
    Figure(fig_sigterm_forwarding),
    Figure(fig_escalation),
    Figure(fig_sqlite_lock_loss),
    Figure(fig_output_rate),
    Figure(fig_output_store),
    Figure(fig_output_store_blob, azurite=True),  # skipped with --skip-azurite
    Figure(fig_dashboard),
    Figure(fig_task_pages),
    Figure(fig_dashboard_azure_calls, azurite=True),
    Figure(fig_receive_depth),
    # Azurite of its own (queue, table, blob) and the Service Bus test broker; needs Azurite
    Figure(fig_startup, azurite=True),
    # one PostgreSQL server of its own (fsync on), PgQueuer and Procrastinate in their venvs
    Figure(fig_postgres),
    # issue 29: cancel, logs -f, a flood beside renewing leases; a PostgreSQL server of its own
    Figure(fig_pg_fleet),
]


def measure(b: Bench, figures: list[Figure], skip_azurite: bool) -> None:
    """Run each figure in order, Azurite running only while Azurite figures measure."""
    try:
        for fig in figures:
            if fig.azurite and skip_azurite:
                continue
            if fig.azurite and b.azurite is None:
                b.azurite = Azurite(b.tmp)
            elif not fig.azurite and b.azurite is not None:
                b.azurite.close()
                b.azurite = None
            fig.measure(b)
    finally:
        if b.azurite is not None:
            b.azurite.close()
            b.azurite = None


def print_table(results: dict[str, object], rows: list[Row]) -> None:
    print(f"jobq-supervisor bench, {results['date']}, {results['machine']}")
    print(f"medians over {results['runs']} run(s), {results['tasks']} tasks for throughput\n")
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="fewer tasks and runs (a smoke test)")
    ap.add_argument("--json", action="store_true", help="print the results as JSON")
    ap.add_argument("--skip-azurite", action="store_true")
    ap.add_argument("--only", metavar="TEXT", help="only the figures whose name contains TEXT "
                    "(a dash matches an underscore: --only pg-fleet)")
    ap.add_argument("--fleet", action="store_true",
                    help="the fleet model instead of the table: storage calls per task and "
                         "per idle worker-hour, cost, workers per queue (bench_fleet.py)")
    ap.add_argument("--fleet-task-seconds", type=float, default=60.0, metavar="S",
                    help="task duration the fleet model extrapolates to (default 60)")
    args = ap.parse_args()
    if args.fleet:
        with tempfile.TemporaryDirectory(prefix="jobq-bench-") as td:
            r = fleet(Path(td), args.quick, args.fleet_task_seconds)
        print(json.dumps(r, indent=2)) if args.json else print_fleet(r)
        return 0
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
    with tempfile.TemporaryDirectory(prefix="jobq-bench-") as td:
        bench = Bench(Path(td), args.quick, runs, n, results)
        measure(bench, [f for f in FIGURES if args.only is None
                        or args.only.replace("-", "_") in f.measure.__name__], args.skip_azurite)
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        print_table(results, bench.rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
