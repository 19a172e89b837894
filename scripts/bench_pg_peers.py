"""The references of the PostgreSQL figure (bench_postgres.py), each a command to time.

* the raw loop: 4 threads of psycopg 3, each claiming ONE row with ``FOR UPDATE SKIP LOCKED``,
  running ``bash -c true`` and deleting the row in the same transaction (one commit per task):
  the least a worker that starts a shell per task and commits per task can do;
* PgQueuer and Procrastinate, pinned versions, each installed once into a venv of its own
  under ``.bench/`` (benchlib.peer_venv), running the same shell task through asyncio's
  subprocess (their handlers are coroutines: the cheapest way either runs a command),
  4 at once, until the queue is empty.

Each function prepares its database (schema, ``n`` tasks pushed: not timed) and returns a
``Drain``: the command the bench times from exec to exit and a check that every task ran.
Everything here runs on the bench's main thread.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchlib import BenchError, peer_venv

PGQUEUER_VERSION = "1.6.0"
PROCRASTINATE_VERSION = "3.10.0"
SLOTS = 4

RAW_LOOP = r'''
import subprocess, sys, threading
import psycopg
url, threads = sys.argv[1], int(sys.argv[2])
errors = []
def work():
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            while True:
                with conn.transaction():
                    row = conn.execute("SELECT id, cmd FROM raw_jobs ORDER BY id LIMIT 1 "
                                       "FOR UPDATE SKIP LOCKED").fetchone()
                    if row is None:
                        return
                    if subprocess.Popen(["/bin/bash", "-c", row[1]]).wait() != 0:
                        raise RuntimeError(f"task {row[0]} failed")
                    conn.execute("DELETE FROM raw_jobs WHERE id = %s", (row[0],))
    except BaseException as exc:
        errors.append(exc)
pool = [threading.Thread(target=work) for _ in range(threads)]
for t in pool:
    t.start()
for t in pool:
    t.join()
sys.exit(f"raw loop failed: {errors[0]!r}" if errors else 0)
'''

# PgQueuer's worker factory and what ``pgq run --mode drain`` does with it (1.6.0's ``pgq
# run`` itself fails at its start with the typer installed beside it: its --log-level
# default reaches the logger as a str): one entrypoint running the payload as a command.
PGQ_MODULE = r'''
import asyncio, contextlib, os
import asyncpg
import pgqueuer
import uvloop
from pgqueuer import PgQueuer
from pgqueuer.db import AsyncpgDriver
from pgqueuer.types import QueueExecutionMode

def drain(batch_size: int, max_concurrent_tasks: int | None) -> None:
    uvloop.run(pgqueuer.run("bench_pgq:main", batch_size=batch_size,
                            max_concurrent_tasks=max_concurrent_tasks,
                            mode=QueueExecutionMode.drain))

@contextlib.asynccontextmanager
async def main():
    conn = await asyncpg.connect(os.environ["BENCH_PG_URL"])
    pgq = PgQueuer(AsyncpgDriver(conn))

    @pgq.entrypoint("shell", concurrency_limit=int(os.environ.get("BENCH_PGQ_LIMIT", "0")))
    async def shell(job) -> None:
        proc = await asyncio.create_subprocess_exec("/bin/bash", "-c", job.payload.decode())
        if await proc.wait() != 0:
            raise RuntimeError("task failed")

    yield pgq
    await conn.close()
'''

PGQ_PUSH = r'''
import asyncio, os, sys
import asyncpg
from pgqueuer.db import AsyncpgDriver
from pgqueuer.queries import Queries

async def push(n: int) -> None:
    conn = await asyncpg.connect(os.environ["BENCH_PG_URL"])
    q = Queries(AsyncpgDriver(conn))
    for lo in range(0, n, 1000):
        k = min(n, lo + 1000) - lo
        await q.enqueue(["shell"] * k, [b"true"] * k, [0] * k)
    await conn.close()

asyncio.run(push(int(sys.argv[1])))
'''

PROC_MODULE = r'''
import asyncio, os
import procrastinate

app = procrastinate.App(connector=procrastinate.PsycopgConnector(
    conninfo=os.environ["BENCH_PG_URL"]))

@app.task(name="shell")
async def shell(cmd: str) -> None:
    proc = await asyncio.create_subprocess_exec("/bin/bash", "-c", cmd)
    if await proc.wait() != 0:
        raise RuntimeError("task failed")

async def push(n: int) -> None:
    async with app.open_async():
        for lo in range(0, n, 1000):
            await shell.batch_defer_async(*[{"cmd": "true"}] * (min(n, lo + 1000) - lo))
'''


@dataclass
class Drain:
    """A prepared run: ``cmd`` (with ``env``) drains the queue and exits 0; ``check`` raises
    BenchError unless every one of the tasks ran and succeeded."""

    cmd: list[str]
    env: dict[str, str]
    check: Callable[[], None]


def _run(cmd: list[str], env: dict[str, str], cwd: Path, what: str) -> None:
    done = subprocess.run(cmd, cwd=cwd, env={**os.environ, **env}, capture_output=True,
                          text=True, timeout=600, stdin=subprocess.DEVNULL)
    if done.returncode != 0:
        raise BenchError(f"{what} failed ({done.returncode}):\n"
                         f"{(done.stderr or done.stdout)[-2000:]}")


def _expect(srv: Any, db: str, sql: str, want: object, what: str) -> Callable[[], None]:
    def check() -> None:
        got = srv.admin(sql, dbname=db)[0][0]
        if got != want:
            raise BenchError(f"{what}: {got}, expected {want}")
    return check


def raw_loop(srv: Any, db: str, n: int, tmp: Path, python: str) -> Drain:
    """The raw loop over ``n`` rows of ``raw_jobs`` in ``db``, run by ``python`` (with
    psycopg 3: the project's venv)."""
    srv.admin("CREATE TABLE raw_jobs (id bigserial PRIMARY KEY, cmd text NOT NULL)", dbname=db)
    srv.admin("INSERT INTO raw_jobs (cmd) SELECT 'true' FROM generate_series(1, %s)",
              dbname=db, params=(n,))
    return Drain([python, "-c", RAW_LOOP, srv.url(db), str(SLOTS)], {},
                 _expect(srv, db, "SELECT count(*) FROM raw_jobs", 0, "raw loop: rows left"))


def pgqueuer(srv: Any, db: str, n: int, tmp: Path) -> Drain:
    """``pgq run --mode drain``: batches of 2, at most 4 tasks at once (its rule: the cap is
    at least twice the batch)."""
    bindir = peer_venv("pgqueuer", PGQUEUER_VERSION, f"pgqueuer[asyncpg]=={PGQUEUER_VERSION}")
    (tmp / "bench_pgq.py").write_text(PGQ_MODULE)
    env = {"BENCH_PG_URL": srv.url(db), "PYTHONPATH": str(tmp)}
    _run([str(bindir / "pgq"), "--pg-dsn", srv.url(db), "install"], env, tmp, "pgq install")
    _run([str(bindir / "python"), "-c", PGQ_PUSH, str(n)], env, tmp, "PgQueuer push")
    check_log = _expect(srv, db, "SELECT count(*) FROM pgqueuer_log WHERE status = "
                        "'successful'", n, "PgQueuer: successful tasks logged")
    check_queue = _expect(srv, db, "SELECT count(*) FROM pgqueuer", 0, "PgQueuer: tasks left")

    def check() -> None:
        check_queue()
        check_log()

    return Drain([str(bindir / "python"), "-c",
                  f"import bench_pgq; bench_pgq.drain({SLOTS // 2}, {SLOTS})"], env, check)


def procrastinate(srv: Any, db: str, n: int, tmp: Path) -> Drain:
    """``procrastinate worker --concurrency 4 --one-shot`` (exits once no job is left)."""
    bindir = peer_venv("procrastinate", PROCRASTINATE_VERSION)
    (tmp / "bench_proc.py").write_text(PROC_MODULE)
    env = {"BENCH_PG_URL": srv.url(db), "PYTHONPATH": str(tmp)}
    exe = str(bindir / "procrastinate")
    _run([exe, "--app", "bench_proc.app", "schema", "--apply"], env, tmp,
         "procrastinate schema --apply")
    _run([str(bindir / "python"), "-c",
          f"import asyncio, bench_proc; asyncio.run(bench_proc.push({n}))"], env, tmp,
         "Procrastinate push")
    return Drain([exe, "--app", "bench_proc.app", "worker", "--concurrency", str(SLOTS),
                  "--one-shot"], env,
                 _expect(srv, db, "SELECT count(*) FROM procrastinate_jobs WHERE status = "
                         "'succeeded'", n, "Procrastinate: succeeded jobs"))
