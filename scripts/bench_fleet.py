"""``scripts/bench --fleet``: the storage calls a Storage Queue worker makes, counted for real,
and what they mean for a fleet: calls per task and per idle worker-hour, cost per million
tasks at list prices, and how many workers one queue carries before its scalability target.

N real ``jobq-supervisor`` processes (``-n SLOTS`` each) run against one Azurite (queue,
table, blob) behind counting proxies (bench_calls.py), with the control plane off and on:

* **busy**: M ``true`` tasks drained by the fleet -> receives, deletes and every other call
  per task (a receive that came back empty counts too: it is the price of polling);
* **renewals**: tasks that ``sleep`` with a short lease -> renewals per task-second, to check
  the model "one renewal per renew interval" (the default 600 s lease renews every 200 s);
* **idle**: the fleet on an empty queue for a window -> calls per worker-hour.

The model then extrapolates to a stated task duration (``--fleet-task-seconds``).  Prices and
the target are assumptions stated in the output (PRICES, TARGET); nothing here talks to Azure.
Runs on the bench's main thread.
"""

from __future__ import annotations

import math
import os
import subprocess
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from bench_calls import CountedAzurite
from benchlib import BIN, BenchError, log_tail, wait_until

# Assumptions, stated with every result (list prices as read by the author; check your region
# and date at the sources before relying on them).
PRICES: dict[str, Any] = {
    "storage_per_10k_ops_usd": 0.004,
    "storage_source": "azure.microsoft.com/pricing/details/storage/queues/ (GPv2, LRS, "
                      "class 1 and 2 queue operations alike; table operations assumed the "
                      "same), as read 2026-11; not re-checked by this run",
    "servicebus_per_million_ops_usd": 0.80,
    "servicebus_source": "azure.microsoft.com/pricing/details/service-bus/ (Standard, 13M-100M "
                         "operations/month; first 13M/month included), as read 2026-11",
}
TARGET: dict[str, Any] = {"messages_per_s_per_queue": 2000,
          "source": "learn.microsoft.com/azure/storage/queues/scalability-targets "
                    "(1 KiB messages)"}
DEFAULT_RENEW_S = 200.0  # --visibility-timeout 600 s / 3
QUEUE = "fleet"


def _fleet(az: CountedAzurite, tmp: Path, workers: int, slots: int, control: str,
           extra: list[str], exit_when_empty: bool) -> list[subprocess.Popen[bytes]]:
    env = {**os.environ, "JOBQ_CONNECTION_STRING": az.conn_str}
    procs = []
    for i in range(workers):
        log = open(tmp / f"w{i}-{control}.log", "wb")  # noqa: SIM115 - closed by the child's exit
        procs.append(subprocess.Popen(
            [str(BIN / "jobq-supervisor"), "--backend", "storage-queue", "--queue", QUEUE,
             "-n", str(slots), "--control", control, "--task-output", "local",
             *(["--exit-when-empty"] if exit_when_empty else []), *extra],
            env=env, cwd=tmp, stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
        log.close()
    return procs


def _wait(procs: list[subprocess.Popen[bytes]], tmp: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    for i, p in enumerate(procs):
        try:
            code = p.wait(max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise BenchError(f"fleet still running after {timeout:g} s") from None
        if code not in (0, 4):
            raise BenchError(f"worker exited {code}:\n{log_tail(next(tmp.glob(f'w{i}-*.log')))}")


def _push(az: CountedAzurite, cmd: str, n: int) -> None:
    from supervisor.backends.storage_queue.backend import StorageQueueBackend
    from supervisor.core.task import Task

    backend = StorageQueueBackend(QUEUE, connection_string=az.conn_str, worker_id="bench")
    backend.push([Task(cmd=cmd) for _ in range(n)])
    backend.close()


def drain(az: CountedAzurite, tmp: Path, workers: int, slots: int, tasks: int, control: str,
          cmd: str = "true", extra: tuple[str, ...] = ()) -> Counter[str]:
    """The calls of a fleet draining ``tasks`` runs of ``cmd``, by kind (pushes excluded)."""
    _push(az, cmd, tasks)
    az.reset()
    _wait(_fleet(az, tmp, workers, slots, control, list(extra), True), tmp, 600)
    calls = az.calls()
    if calls["queue delete"] < tasks:
        raise BenchError(f"{calls['queue delete']} deletes for {tasks} tasks: {dict(calls)}")
    return calls


def idle(az: CountedAzurite, tmp: Path, workers: int, control: str, window: float) -> Counter[str]:
    """The calls of an idle fleet over ``window`` seconds, from its 5th second (start-up
    calls are not idle calls)."""
    procs = _fleet(az, tmp, workers, 1, control, [], False)
    try:
        wait_until(lambda: az.calls()["queue receive"] >= workers, 60, what="first receives")
        time.sleep(5.0)
        az.reset()
        time.sleep(window)
        return az.calls()
    finally:
        for p in procs:
            p.terminate()
        _wait(procs, tmp, 60)


def _storage_calls(calls: Counter[str]) -> int:
    return sum(n for kind, n in calls.items() if not kind.startswith("queue put"))


def model(per_task: dict[str, float], idle_per_hour: float, task_s: float, slots: int) -> dict:
    """Calls per task at ``task_s`` seconds a task (default lease), the cost of a million
    tasks, and the fleet that reaches the queue's target."""
    renewals = math.floor(task_s / DEFAULT_RENEW_S)
    queue_calls = per_task["queue"] + renewals
    total = queue_calls + per_task["table"]
    tasks_per_s = slots / task_s  # per worker, slots always busy
    # While busy a worker's control calls go on as when idle (heartbeat, poll).
    per_s = tasks_per_s * total + per_task["control_idle_per_s"]
    target = TARGET["messages_per_s_per_queue"]
    return {
        "task_seconds": task_s, "slots": slots, "renewals_per_task": renewals,
        "queue_calls_per_task": queue_calls, "calls_per_task": total,
        "calls_per_s_per_worker": per_s,
        "cost_per_million_tasks_usd": total * 1e6 / 10_000 * PRICES["storage_per_10k_ops_usd"],
        "idle_cost_per_worker_month_usd": idle_per_hour * 730 / 10_000
        * PRICES["storage_per_10k_ops_usd"],
        # The target counts messages; every queue call is counted against it (conservative).
        "workers_at_target_by_queue_calls": math.floor(target / (tasks_per_s * queue_calls)),
        "workers_at_target_by_messages": math.floor(target / tasks_per_s),
    }


def fleet(tmp_root: Path, quick: bool, task_s: float = 60.0, slots: int = 4) -> dict:
    workers = 2 if quick else 3
    tasks = 100 if quick else 300
    window = 20.0 if quick else 60.0
    out: dict = {"workers": workers, "slots": slots, "tasks": tasks, "idle_window_s": window,
                 "prices": PRICES, "target": TARGET}
    with tempfile.TemporaryDirectory(dir=tmp_root) as name:
        tmp = Path(name)
        az = CountedAzurite(tmp)
        try:
            _push(az, "true", 1)  # the queue exists: creation is not a per-task call
            _wait(_fleet(az, tmp, 1, 1, "off", [], True), tmp, 120)
            for control in ("off", "auto"):
                busy = drain(az, tmp, workers, slots, tasks, control)
                quiet = idle(az, tmp, workers, control, window)
                per_hour = sum(quiet.values()) * 3600 / window / workers
                table_idle = sum(n for k, n in quiet.items() if not k.startswith("queue"))
                per_task = {
                    "receive": busy["queue receive"] / tasks,
                    "delete": busy["queue delete"] / tasks,
                    "renew": busy["queue renew/release"] / tasks,
                    "queue": sum(n for k, n in busy.items() if k.startswith("queue")) / tasks,
                    "table": sum(n for k, n in busy.items() if k.startswith("table")) / tasks,
                    "blob": sum(n for k, n in busy.items() if k.startswith("blob")) / tasks,
                    "control_idle_per_s": table_idle / window / workers,
                }
                out[control] = {"busy_calls": dict(busy), "idle_calls": dict(quiet),
                                "per_task": per_task, "idle_calls_per_worker_hour": per_hour,
                                "model": model(per_task, per_hour, task_s, slots)}
            # Renewals: 3 s tasks under a 6 s lease renewed every second.
            rn = drain(az, tmp, 1, 2, 6, "off", "sleep 3",
                       ("--visibility-timeout", "6", "--renew-interval", "1"))
            out["renewals_per_task_second_at_1s"] = rn["queue renew/release"] / (6 * 3.0)
        finally:
            az.close()
    out["servicebus"] = servicebus_per_task(tmp_root, workers, slots, tasks)
    return out


def servicebus_per_task(tmp_root: Path, workers: int, slots: int, tasks: int) -> dict:
    """Operations per task of a fleet draining ``tasks`` ``true`` tasks on the project's
    Service Bus test broker (in this process, on a thread), from the broker's event log:
    deliveries, completes, renewals.  Receive requests that came back empty are not in that
    log (the broker does not record link credit), so idle calls are not counted here."""
    import sys

    from benchlib import REPO

    sys.path.insert(0, str(REPO))
    from tests.servicebus.broker import ServiceBusTestBroker

    broker = ServiceBusTestBroker().start()
    try:
        with tempfile.TemporaryDirectory(dir=tmp_root) as name:
            tmp = Path(name)
            env = {**os.environ, "JOBQ_CONNECTION_STRING": broker.connection_string}
            args = ["--backend", "servicebus", "--queue", QUEUE]
            subprocess.run([str(BIN / "jobq-ctl"), *args, "push",
                            *[a for _ in range(tasks) for a in ("-c", "true")]],
                           env=env, check=True, stdout=subprocess.DEVNULL, timeout=120)
            procs = [subprocess.Popen([str(BIN / "jobq-supervisor"), *args, "-n", str(slots),
                                       "--exit-when-empty", "--control", "off"],
                                      env=env, cwd=tmp, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL, start_new_session=True)
                     for _ in range(workers)]
            _wait(procs, tmp, 600)
        kinds = Counter(e.kind for e in broker.events() if e.kind != "enqueue")
    finally:
        broker.stop()
    if kinds["complete"] < tasks:
        raise BenchError(f"{kinds['complete']} completes for {tasks} tasks: {dict(kinds)}")
    per_task = {k: n / tasks for k, n in kinds.items()}
    ops = sum(per_task.values())
    return {"events": dict(kinds), "per_task": per_task, "operations_per_task": ops,
            "cost_per_million_tasks_usd": ops * PRICES["servicebus_per_million_ops_usd"]}


def print_fleet(r: dict) -> None:
    p, t = r["prices"], r["target"]
    print(f"jobq-supervisor fleet model: {r['workers']} workers x -n {r['slots']} on one "
          f"Azurite queue; {r['tasks']} `true` tasks; idle window {r['idle_window_s']:.0f} s\n")
    for control, label in (("off", "--control off"), ("auto", "control plane on")):
        c = r[control]
        pt, m = c["per_task"], c["model"]
        print(f"{label}:")
        print(f"  per task: receive {pt['receive']:.2f}, delete {pt['delete']:.2f}, "
              f"renew {pt['renew']:.2f}, queue total {pt['queue']:.2f}, table {pt['table']:.2f}"
              f", blob {pt['blob']:.2f}")
        print(f"  idle: {c['idle_calls_per_worker_hour']:.0f} calls per worker-hour "
              f"({', '.join(f'{n} {k}' for k, n in sorted(c['idle_calls'].items()))} "
              f"in {r['idle_window_s']:.0f} s x {r['workers']} workers)")
        print(f"  at {m['task_seconds']:.0f} s a task, -n {m['slots']}: "
              f"{m['calls_per_task']:.2f} calls per task ({m['renewals_per_task']} renewals), "
              f"{m['calls_per_s_per_worker']:.3f} calls/s per worker; "
              f"${m['cost_per_million_tasks_usd']:.2f} per million tasks; idle worker "
              f"${m['idle_cost_per_worker_month_usd']:.2f} a month")
        print(f"  one queue at {t['messages_per_s_per_queue']} messages/s: "
              f"{m['workers_at_target_by_messages']} workers (by messages), "
              f"{m['workers_at_target_by_queue_calls']} (every queue call counted)\n")
    sb = r["servicebus"]
    print("Service Bus (test broker, --control off): "
          + ", ".join(f"{k} {v:.2f}" for k, v in sorted(sb["per_task"].items()))
          + f" per task = {sb['operations_per_task']:.2f} operations, "
          f"${sb['cost_per_million_tasks_usd']:.2f} per million tasks (empty receives not "
          "counted)")
    print(f"renewals measured: {r['renewals_per_task_second_at_1s']:.2f} per task-second at "
          "--renew-interval 1 (model: 1.00)")
    print("assumptions: storage ${:.4f} per 10,000 operations ({}); Service Bus ${:.2f} per "
          "million operations ({}); target {} messages/s per queue ({})".format(
              p["storage_per_10k_ops_usd"], p["storage_source"],
              p["servicebus_per_million_ops_usd"], p["servicebus_source"],
              t["messages_per_s_per_queue"], t["source"]))
