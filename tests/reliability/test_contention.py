"""SQLite contention: 4 supervisors x 4 slots on one database file drain 2,000 tasks; each task
appends its id to one file, and every id is there exactly once."""

from __future__ import annotations

import re
import time
from collections import Counter

import pytest

# serial: several supervisors race on one file: CPU-heavy
pytestmark = [pytest.mark.serial, pytest.mark.slow, pytest.mark.timeout(240)]

TASKS = 2000
SUPERVISORS = 4


def test_sqlite_contention_each_task_exactly_once(env):
    out = env.tmp / "ids"
    cmd = f"echo $JOBQ_TASK_ID >> {out}\n"
    ids = env.ctl("push", "--file", "-", input=cmd * TASKS).stdout.split()
    assert len(ids) == TASKS
    t0 = time.monotonic()
    sups = [env.supervisor("-n", "4", "--exit-when-empty", "--poll-interval", "0.2")
            for _ in range(SUPERVISORS)]
    for sup in sups:
        assert sup.wait(180) == 0, sup.log()[-3000:]
    elapsed = time.monotonic() - t0
    seen = Counter(out.read_text().split())
    twice = [i for i, n in seen.items() if n > 1]
    assert not twice, f"{len(twice)} task(s) ran more than once: {twice[:5]}"
    missing = set(ids) - set(seen)
    assert not missing, f"{len(missing)} task(s) never ran: {sorted(missing)[:5]}"
    assert set(seen) == set(ids)
    assert env.rows("SELECT status, COUNT(*) FROM jobs GROUP BY status") == [("succeeded", TASKS)]
    per_sup = []
    for sup in sups:
        log = sup.log()
        assert "lock lost" not in log and "Traceback" not in log, log[-3000:]
        m = re.search(r"summary: succeeded=(\d+) failed=0 dead_lettered=0 retried=0", log)
        assert m, log[-2000:]
        per_sup.append(int(m.group(1)))
    assert sum(per_sup) == TASKS
    print(f"{TASKS} tasks in {elapsed:.1f}s ({TASKS / elapsed:.0f}/s); per supervisor {per_sup}")
