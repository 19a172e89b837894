"""Acceptance 8 (and 2): several supervisors share one SQLite file; every task runs once."""

from __future__ import annotations

import collections

import pytest

pytestmark = pytest.mark.timeout(240)


def test_four_supervisors_drain_400_tasks_exactly_once(env):
    out = env.tmp / "ids.txt"
    # Each task takes a moment, so that a supervisor that starts last still finds work: the
    # check that all four took part must not depend on how fast the others drain.
    cmds = [f"echo $JOBQ_TASK_ID >> {out}; sleep 0.1" for _ in range(400)]
    env.ctl("push", "--file", "-", input="\n".join(cmds) + "\n")
    assert env.ctl("size").stdout.strip() == "400"
    sups = [env.supervisor("-n", "4", "--exit-when-empty", "--poll-interval", "0.2")
            for _ in range(4)]
    for sup in sups:
        assert sup.wait(180) == 0, sup.log()[-2000:]
    ids = [line for line in out.read_text().splitlines() if line]
    counts = collections.Counter(ids)
    pushed = {r[0] for r in env.rows("SELECT id FROM jobs")}
    assert set(counts) == pushed and len(pushed) == 400
    assert all(c == 1 for c in counts.values()), [i for i, c in counts.items() if c > 1]
    assert env.rows("SELECT status, COUNT(*) FROM jobs GROUP BY status") == [("succeeded", 400)]
    # all four took part
    assert all("finished: exit status 0" in sup.log() for sup in sups)
