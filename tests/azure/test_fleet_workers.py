"""Acceptance 1 of issue 15: three SQLite workers and two Storage Queue workers (Azurite's queue
service, control store in the same account's table service: one connection string carrying
both endpoints, no control option).  ``jobq-ctl workers --json`` shows, per queue, what really
runs -- each record appears within two heartbeat intervals of its task's start; a SIGKILLed
worker becomes ``lost`` (``--all`` only) after three intervals; a worker stopped with SIGTERM
deletes its record."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path
from typing import Any, Callable

import psutil
import pytest

from supervisor.fleet.control.azure_table import AzureTableControlStore
from supervisor.fleet.control.base import ControlStore
from supervisor.fleet.control.sqlite import SqliteControlStore
from tests.conftest import Env, Supervisor, wait_for

# timing: asserts heartbeats within two intervals
pytestmark = [pytest.mark.timing, pytest.mark.azure, pytest.mark.timeout(180)]

INTERVAL = 1.0  # --heartbeat-interval
FAST = ("--control-interval", "1", "--heartbeat-interval", str(INTERVAL), "--poll-interval",
        "0.2")  # one slot per worker


def long_task(tmp: Path) -> str:
    """Runs until killed; says it started with a file named after its task id."""
    return f"touch {tmp}/ready.$JOBQ_TASK_ID; while true; do sleep 0.2; done"


def both_endpoints(queue_conn: str, table_port: int) -> str:
    return f"{queue_conn};TableEndpoint=http://127.0.0.1:{table_port}/devstoreaccount1"


def shown(ctl: Callable[..., Any], *flags: str) -> dict[str, dict]:
    res = ctl("workers", "--json", *flags)
    assert res.returncode == 0, res.stderr
    return {w["id"]: w for w in json.loads(res.stdout)}


def check_fleet(name: str, tmp: Path, store: ControlStore, queue: str,
                ctl: Callable[..., Any], sups: dict[str, Supervisor], ids: list[str]) -> None:
    """Each worker runs one of ``ids``; its record says so, with the real pids."""
    ready = {i: tmp / f"ready.{i}" for i in ids}
    wait_for(lambda: all(p.exists() for p in ready.values()), 60, what=f"{name}: tasks started")
    # The first record listing a task was written by the worker at most two heartbeat
    # intervals after the task started (both wall-clock times are taken on this machine; a
    # slow poll of ours does not count against the worker).
    first_seen: dict[str, float] = {}

    def all_listed() -> bool:
        for rec in store.workers(queue):
            for t in rec.tasks:
                first_seen.setdefault(t.id, rec.heartbeat)
        return set(first_seen) == set(ids)

    wait_for(all_listed, 30, interval=0.1, what=f"{name}: every task in a worker record")
    for task_id in ids:
        started = ready[task_id].stat().st_mtime
        assert first_seen[task_id] - started <= 2 * INTERVAL, (name, task_id, first_seen,
                                                              started)
    workers = shown(ctl)
    assert set(workers) == set(sups), workers
    running: set[str] = set()
    for wid, w in workers.items():
        assert w["pid"] == sups[wid].pid and w["state"] == "running", w
        assert w["slots"] == {"used": 1, "total": 1}, w
        (task,) = w["tasks"]
        assert task["attempt"] == 1 and task["lease_expires"].endswith("Z"), task
        # the pid shown is a live process started by that very supervisor
        assert task["pid"] in {c.pid for c in psutil.Process(w["pid"]).children()}, (wid, task)
        assert task["cmd"].startswith(f"touch {tmp}/ready."), task
        running.add(task["id"])
    assert running == set(ids)


def kill_then_stop(name: str, store: ControlStore, queue: str, ctl: Callable[..., Any],
                   killed: Supervisor, stopped: Supervisor, kept: set[str]) -> None:
    kid, sid = (worker_id(store, queue, s.pid) for s in (killed, stopped))
    killed.signal(signal.SIGKILL)
    assert killed.wait(30) == -signal.SIGKILL
    t_kill = time.monotonic()
    wait_for(lambda: shown(ctl, "--all").get(kid, {}).get("state") == "lost",
             3 * INTERVAL + 30, interval=0.2, what=f"{name}: {kid} shown as lost")
    # not before three intervals without a heartbeat (its last one may predate the kill)
    assert time.monotonic() - t_kill > 2 * INTERVAL
    assert kid not in shown(ctl), "a lost worker is listed with --all only"
    stopped.signal(signal.SIGTERM)
    assert stopped.wait(60) == 0
    everything = shown(ctl, "--all")
    assert sid not in everything, "a cleanly stopped worker deletes its record"
    assert set(shown(ctl)) == kept
    assert everything[kid]["state"] == "lost"


def worker_id(store: ControlStore, queue: str, pid: int) -> str:
    (rec,) = [r for r in store.workers(queue) if r.pid == pid]
    return rec.id


def test_workers_json_matches_the_fleet_on_sqlite_and_storage_queue(
        tmp_path, sq, azurite_table):
    # --- three SQLite workers, one task each
    sql_dir = tmp_path / "sqlite"
    sql_dir.mkdir()
    env = Env(sql_dir)
    sql_store = SqliteControlStore(str(env.db))
    sq_env = {"JOBQ_CONNECTION_STRING": both_endpoints(sq.conn_str, azurite_table)}
    sq_store = AzureTableControlStore(connection_string=sq_env["JOBQ_CONNECTION_STRING"])
    try:
        sql_ids = env.push(*[long_task(sql_dir)] * 3)
        sql_sups = {}
        for n in (1, 2, 3):
            sup = env.supervisor("--worker-id", f"sql-{n}", *FAST, name=f"sql-{n}")
            sql_sups[f"sql-{n}"] = sup
        # --- two Storage Queue workers, one task each; the control store is found from the
        # queue's own connection string (TableEndpoint=), no control option given
        sq_ids = [sq.ctl("push", "-c", long_task(sq.tmp), env=sq_env).stdout.strip()
                  for _ in range(2)]
        sq_sups = {f"sq-{n}": sq.supervisor("--worker-id", f"sq-{n}", *FAST, env=sq_env,
                                            name=f"sq-{n}") for n in (1, 2)}

        def sql_ctl(*args: str) -> Any:
            return env.ctl(*args, check=False)

        def sq_ctl(*args: str) -> Any:
            return sq.ctl(*args, check=False, env=sq_env)

        check_fleet("sqlite", sql_dir, sql_store, "default", sql_ctl, sql_sups, sql_ids)
        check_fleet("storage-queue", sq.tmp, sq_store, sq.queue, sq_ctl, sq_sups, sq_ids)
        # the two queues' records stay apart
        assert not {w.id for w in sq_store.workers(sq.queue)} & set(sql_sups)

        kill_then_stop("sqlite", sql_store, "default", sql_ctl, sql_sups["sql-2"],
                       sql_sups["sql-3"], {"sql-1"})
        kill_then_stop("storage-queue", sq_store, sq.queue, sq_ctl, sq_sups["sq-1"],
                       sq_sups["sq-2"], set())
        for sup in (sql_sups["sql-1"],):
            sup.signal(signal.SIGTERM)
            assert sup.wait(60) == 0
    finally:
        env.cleanup()
        sql_store.close()
        sq_store.close()
