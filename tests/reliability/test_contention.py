"""Contention: several supervisors drain 2,000 tasks from one queue -- 4 x 4 slots on one
SQLite file; 2 (issue 28's acceptance) on one PostgreSQL queue, over TCP to 127.0.0.1.  Each
task appends its id to one file, and every id is there exactly once."""

from __future__ import annotations

import re
import time
from collections import Counter

import pytest
from psycopg.conninfo import conninfo_to_dict

from tests.conftest import Env

# stress: several supervisors race on one queue
pytestmark = [pytest.mark.stress, pytest.mark.slow, pytest.mark.timeout(240)]

TASKS = 2000
SUPERVISORS = {"sqlite": 4, "postgres": 2}
STARTED = re.compile(r"worker (\S+) started: backend=")


def _states(name: str, e: Env) -> list[tuple]:
    if name == "sqlite":
        return e.rows("SELECT status, COUNT(*) FROM jobs GROUP BY status")
    return e.rows("SELECT state, COUNT(*) FROM jobq.jobs GROUP BY state")


@pytest.mark.parametrize("name", ["sqlite", pytest.param("postgres",
                                                         marks=pytest.mark.postgres)])
def test_contention_each_task_exactly_once(request, name):
    e: Env = request.getfixturevalue("env" if name == "sqlite" else "pg")
    if name == "postgres":
        assert conninfo_to_dict(e.url)["host"] == "127.0.0.1"  # type: ignore[attr-defined]
    out = e.tmp / "ids"
    cmd = f"echo $JOBQ_TASK_ID >> {out}\n"
    ids = e.ctl("push", "--file", "-", input=cmd * TASKS).stdout.split()
    assert len(ids) == TASKS
    t0 = time.monotonic()
    sups = [e.supervisor("-n", "4", "--exit-when-empty", "--poll-interval", "0.2")
            for _ in range(SUPERVISORS[name])]
    for sup in sups:
        assert sup.wait(180) == 0, sup.log()[-3000:]
    elapsed = time.monotonic() - t0
    seen = Counter(out.read_text().split())
    twice = [i for i, n in seen.items() if n > 1]
    assert not twice, f"{len(twice)} task(s) ran more than once: {twice[:5]}"
    missing = set(ids) - set(seen)
    assert not missing, f"{len(missing)} task(s) never ran: {sorted(missing)[:5]}"
    assert set(seen) == set(ids)
    assert _states(name, e) == [("succeeded", TASKS)]
    per_sup = []
    workers = []
    for sup in sups:
        log = sup.log()
        assert "lock lost" not in log and "Traceback" not in log, log[-3000:]
        m = re.search(r"summary: succeeded=(\d+) failed=0 dead_lettered=0 retried=0", log)
        assert m, log[-2000:]
        per_sup.append(int(m.group(1)))
        workers += STARTED.findall(log)
    assert sum(per_sup) == TASKS
    assert len(set(workers)) == len(sups), f"worker ids not distinct: {workers}"
    if name == "postgres":
        # who ended each task, as the database recorded it: both, and no one else
        by_worker = dict(e.rows("SELECT worker, COUNT(*) FROM jobq.jobs GROUP BY worker"))
        assert set(by_worker) == set(workers), by_worker
        assert sorted(by_worker.values()) == sorted(per_sup), (by_worker, per_sup)
        assert min(per_sup) > 0, f"one supervisor drained the queue alone: {per_sup}"
    print(f"{name}: {TASKS} tasks in {elapsed:.1f}s ({TASKS / elapsed:.0f}/s); "
          f"per supervisor {per_sup}")
