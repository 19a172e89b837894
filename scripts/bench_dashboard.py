"""The dashboard's costs: how long the overview and workers pages take to render on a big
SQLite queue, and how many storage calls one open page makes per minute on Azure.

Render: a real ``jobq-ctl dashboard`` process on a queue of 10,000 pending and 1,000 running
tasks with 50 worker records (20 running tasks each); the median and the slowest of
``REQUESTS`` GETs of each page over loopback HTTP, after two to warm up.

Azure calls: the dashboard's app in this process against Azurite's queue, table and blob
services, every HTTP request the Azure SDK sends counted by a hook on its transport; a page's
calls per minute are its calls per render times the renders per minute (the overview and the
task page refresh every 15 s on Azure, the task page's output every 2 s while the attempt is
written), and the sampler's are counted apart (one per dashboard, whatever the pages).
Run alone: ``.venv/bin/python scripts/bench_dashboard.py``.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import sqlite3
import statistics
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

from benchlib import ACCOUNT_KEY, BIN, REPO, BenchError, dashboard, wait_until

PENDING, RUNNING, WORKERS = 10_000, 1_000, 50
REQUESTS = 20
ACCOUNT = "devstoreaccount1"
AZURE_REFRESH, OUTPUT_POLL, SAMPLE = 15.0, 2.0, 15.0  # seconds (serve.py, app.js)


def _fill(db: Path) -> None:
    """PENDING + RUNNING tasks, RUNNING of them running on WORKERS live worker records."""
    cmds = "".join(f"echo task-{i}\n" for i in range(PENDING + RUNNING))
    subprocess.run([str(BIN / "jobq-ctl"), "--sqlite-path", str(db), "push", "--file", "-"],
                   input=cmds, text=True, check=True, capture_output=True, timeout=300)
    now = time.time()
    conn = sqlite3.connect(db, timeout=30)
    with conn:
        ids = [r[0] for r in conn.execute("SELECT id FROM jobs ORDER BY seq LIMIT ?",
                                          (RUNNING,))]
        conn.executemany(
            "UPDATE jobs SET status='running', attempt=1, locked_by=?, locked_at=?, "
            "locked_until=? WHERE id=?",
            [(f"w-{i % WORKERS:02d}", now, now + 3600, task_id) for i, task_id in enumerate(ids)])
    conn.close()
    from supervisor.fleet.control.records import TaskInfo, WorkerRecord
    from supervisor.fleet.control.sqlite import SqliteControlStore

    store = SqliteControlStore(str(db))
    try:
        for w in range(WORKERS):
            mine = ids[w::WORKERS]
            tasks = tuple(TaskInfo(id=t, attempt=1, pid=1000 + i, started=now,
                                   lease_expires=now + 3600, cmd=f"echo {t}")
                          for i, t in enumerate(mine))
            store.put_worker(WorkerRecord(
                id=f"w-{w:02d}", queue="default", host=f"host-{w}", pid=100 + w,
                version="bench", state="running", slots_used=len(mine),
                slots_total=len(mine), started=now, heartbeat=now + 3600, interval=15.0,
                tasks=tasks))
    finally:
        store.close()


def render_times(tmp: Path) -> dict[str, Any]:
    """Milliseconds to serve / and /workers: {page: {"median_ms", "max_ms"}}."""
    db = tmp / "dash.db"
    db.unlink(missing_ok=True)
    _fill(db)
    with dashboard(["--sqlite-path", str(db), "dashboard", "--bind", "127.0.0.1:0"],
                   tmp) as url:
        out: dict[str, Any] = {}
        for page in ("/", "/workers"):
            took = []
            for i in range(REQUESTS + 2):
                t0 = time.perf_counter()
                with urllib.request.urlopen(url + page, timeout=60) as resp:
                    body = resp.read()
                    if resp.status != 200:
                        raise BenchError(f"{page}: HTTP {resp.status}")
                if page == "/" and b'id="count-pending">10000<' not in body:
                    raise BenchError("the overview does not show the 10,000 pending tasks")
                if i >= 2:
                    took.append((time.perf_counter() - t0) * 1000)
            out[page] = {"median_ms": round(statistics.median(took), 1),
                         "max_ms": round(max(took), 1), "bytes": len(body)}
        return out


# ------------------------------------------------------------------------ tasks page
LISTED, PAGE_NO = 100_000, 50


def _fill_listing(db: Path) -> None:
    """LISTED tasks: pushed through jobq-ctl, then most of them ended (a queue's usual mix:
    70 % succeeded, 10 % failed, 2 % cancelled, 1 % running, the rest pending)."""
    cmds = "".join(f"python train.py --seed {i}\n" for i in range(LISTED))
    subprocess.run([str(BIN / "jobq-ctl"), "--sqlite-path", str(db), "push", "--file", "-"],
                   input=cmds, text=True, check=True, capture_output=True, timeout=600)
    conn = sqlite3.connect(db, timeout=30)
    with conn:
        conn.execute("UPDATE jobs SET status=CASE WHEN seq % 100 < 70 THEN 'succeeded' "
                     "WHEN seq % 100 < 80 THEN 'failed' WHEN seq % 100 < 82 THEN 'failed' "
                     "WHEN seq % 100 < 83 THEN 'running' ELSE 'pending' END, "
                     "reason=CASE WHEN seq % 100 BETWEEN 80 AND 81 THEN 'cancelled by bench' "
                     "WHEN seq % 100 BETWEEN 70 AND 79 THEN 'exit status 1' END, "
                     "attempt=CASE WHEN seq % 100 < 83 THEN 1 ELSE 0 END, "
                     "locked_by=CASE WHEN seq % 100 < 83 THEN 'w-' || (seq % 7) END")
    conn.close()


def task_page_times(tmp: Path) -> dict[str, Any]:
    """Milliseconds to serve page PAGE_NO (100 tasks a page, reached by its keyset link) of
    /tasks on a queue of LISTED tasks: all, one state, one worker, and a text search (the
    search's first page: it reads until 100 match)."""
    db = tmp / "tasks.db"
    db.unlink(missing_ok=True)
    _fill_listing(db)
    err = tmp / "dashboard-tasks.err"
    with open(err, "wb") as fh:
        proc = subprocess.Popen([str(BIN / "jobq-ctl"), "--sqlite-path", str(db), "dashboard",
                                 "--bind", "127.0.0.1:0"], stderr=fh,
                                stdout=subprocess.DEVNULL, cwd=tmp, start_new_session=True)
    try:
        wait_until(lambda: re.search(r"dashboard on (\S+)", err.read_text()), 30,
                   what="the dashboard's URL line")
        m = re.search(r"dashboard on (\S+)", err.read_text())
        assert m is not None
        url = m.group(1).rstrip("/")

        def get(path: str) -> dict[str, Any]:
            with urllib.request.urlopen(url + path, timeout=60) as resp:
                if resp.status != 200:
                    raise BenchError(f"{path}: HTTP {resp.status}")
                return dict(json.loads(resp.read()))

        out: dict[str, Any] = {}
        for name, query in (("all", ""), ("failed", "state=failed"),
                            ("worker", "worker=w-3"), ("text", "q=--seed%2012345")):
            cursor = None
            for _ in range(PAGE_NO - 1 if name != "text" else 0):  # to page PAGE_NO
                page = get(f"/api/tasks?{query}" + (f"&after={cursor}" if cursor else ""))
                cursor = page["next"]
                if cursor is None:
                    raise BenchError(f"/api/tasks?{query}: fewer than {PAGE_NO} pages")
            path = "/tasks?" + query + (f"&after={cursor}" if cursor else "")
            took = []
            for i in range(REQUESTS + 2):
                t0 = time.perf_counter()
                with urllib.request.urlopen(url + path, timeout=60) as resp:
                    body = resp.read()
                if body.count(b"<tr data-id=") != (1 if name == "text" else 100):
                    raise BenchError(f"{path}: not a full page")
                if i >= 2:
                    took.append((time.perf_counter() - t0) * 1000)
            out[name] = {"median_ms": round(statistics.median(took), 1),
                         "max_ms": round(max(took), 1)}
        return out
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)


# ------------------------------------------------------------------------ Azure calls
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _azurite(service: str, tmp: Path) -> tuple[subprocess.Popen[bytes], int]:
    binary = str(REPO / ".azurite" / "node_modules" / ".bin" / f"azurite-{service}")
    port = _free_port()
    cwd = tmp / f"azurite-{service}"
    cwd.mkdir(exist_ok=True)
    proc = subprocess.Popen([binary, f"--{service}Host", "127.0.0.1", f"--{service}Port",
                             str(port), "--inMemoryPersistence", "--skipApiVersionCheck",
                             "--disableTelemetry", "--silent"], cwd=cwd,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)

    def up() -> bool:
        with socket.socket() as s:
            return s.connect_ex(("127.0.0.1", port)) == 0
    wait_until(up, 30, 0.1, what=f"Azurite {service}")
    return proc, port


def azure_calls(tmp: Path) -> dict[str, Any]:
    """Storage calls per render of each page and per minute of one open page."""
    from azure.core.pipeline.transport import RequestsTransport

    procs = []
    saved = {k: os.environ.get(k) for k in ("JOBQ_CONNECTION_STRING",
                                            "JOBQ_CONTROL_CONNECTION_STRING")}
    try:
        ports = {}
        for service in ("queue", "table", "blob"):
            proc, ports[service] = _azurite(service, tmp)
            procs.append(proc)
        return _count(tmp, ports, RequestsTransport)
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        for proc in procs:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


def _count(tmp: Path, ports: dict[str, int], transport: Any) -> dict[str, Any]:
    from supervisor.backends import open_backend
    from supervisor.dashboard.app import create_app
    from supervisor.dashboard.data import DataSource
    from supervisor.dashboard.history import History, Sampler
    from supervisor.fleet.control.open import open_control_store
    from supervisor.fleet.output.base import AttemptKey
    from supervisor.fleet.output.open import open_output_store
    from supervisor.worker.main import parse_worker_settings

    base = f"DefaultEndpointsProtocol=http;AccountName={ACCOUNT};AccountKey={ACCOUNT_KEY};"
    os.environ["JOBQ_CONNECTION_STRING"] = (
        base + f"QueueEndpoint=http://127.0.0.1:{ports['queue']}/{ACCOUNT}")
    os.environ["JOBQ_CONTROL_CONNECTION_STRING"] = (
        base + f"TableEndpoint=http://127.0.0.1:{ports['table']}/{ACCOUNT};"
        f"BlobEndpoint=http://127.0.0.1:{ports['blob']}/{ACCOUNT}")
    settings = parse_worker_settings(["--backend", "storage-queue", "--queue", "bench"])
    subprocess.run([str(BIN / "jobq-ctl"), "--backend", "storage-queue", "--queue", "bench",
                    "push", "-c", "echo one"], check=True, capture_output=True, timeout=60)
    task_id = "bench-task"
    output = open_output_store(settings, create=True)
    assert output is not None
    key = AttemptKey("bench", task_id, 1)
    output.append(key, b"first line\n")
    store = open_control_store(settings, create=True)
    assert store is not None
    from supervisor.fleet.control.records import ResultRecord

    store.put_result(ResultRecord(queue="bench", task_id=task_id, attempt=1, outcome="running",
                                  reason="", tail="", exit_status=None, worker="w",
                                  when=time.time(), started=time.time()))
    data = DataSource("bench", lambda: open_backend(settings, for_ctl=True, create=False),
                      lambda: open_control_store(settings, create=False), None,
                      lambda: open_output_store(settings, create=False))
    client = create_app(data, History(), refresh=int(AZURE_REFRESH)).test_client()
    calls: Counter[str] = Counter()
    send = transport.send
    by_port = {str(p): s for s, p in ports.items()}

    def counting(self: Any, request: Any, **kwargs: Any) -> Any:
        port = re.search(r"://[^/:]+:(\d+)", request.url)
        calls[by_port.get(port.group(1) if port else "", "other")] += 1
        return send(self, request, **kwargs)

    def cost(fn: Any) -> dict[str, int]:
        calls.clear()
        fn()
        return dict(calls)

    transport.send = counting
    try:
        for path in ("/", f"/tasks/{task_id}"):  # open every client once
            client.get(path)
        per = {"overview": cost(lambda: client.get("/")),
               "workers": cost(lambda: client.get("/workers")),
               "failed": cost(lambda: client.get("/failed")),
               "task page": cost(lambda: client.get(f"/tasks/{task_id}")),
               "output, first call": cost(lambda: client.get(
                   f"/api/task/{task_id}/output?attempt=1"))}
        output.append(key, b"second line\n")
        per["output poll, new lines"] = cost(lambda: client.get(
            f"/api/task/{task_id}/output?attempt=1&offset=11"))
        per["output poll, nothing new"] = cost(lambda: client.get(
            f"/api/task/{task_id}/output?attempt=1&offset=23"))
        per["sampler"] = cost(Sampler(data, History()).sample_once)
    finally:
        transport.send = send
        store.close()
        output.close()
    total = {k: sum(v.values()) for k, v in per.items()}
    minute = {
        "overview": round(total["overview"] * 60 / AZURE_REFRESH),
        "workers": round(total["workers"] * 60 / AZURE_REFRESH),
        "failed": round(total["failed"] * 60 / AZURE_REFRESH),
        "task page (output being written)": round(
            total["task page"] * 60 / AZURE_REFRESH
            + total["output poll, new lines"] * 60 / OUTPUT_POLL),
        "task page (output complete)": round(total["task page"] * 60 / AZURE_REFRESH),
        "sampler (one per dashboard)": round(total["sampler"] * 60 / SAMPLE),
    }
    return {"per_call": per, "per_minute": minute}


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory(prefix="jobq-bench-dash-") as td:
        result = {"render": render_times(Path(td))}
        if "--skip-azurite" not in sys.argv:
            result["azure_calls"] = azure_calls(Path(td))
    print(json.dumps(result, indent=2))
