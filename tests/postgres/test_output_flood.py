"""Issue 29, acceptance 4, functional side (the latencies are scripts/bench's, ``--only
pg-fleet``): a 150 MB output flood from one task beside running tasks on a PostgreSQL queue
loses no lease, is stored up to ``--task-output-max`` with its marker, and leaves the
supervisor's RSS bounded as on SQLite (tests/integration/test_output_store.py's 200 MB
flood)."""

from __future__ import annotations

import pytest

from supervisor.fleet.output.base import TRUNCATED, AttemptKey
from supervisor.fleet.output.postgres import PostgresOutputStore
from tests.integration.helpers import gauges
from tests.integration.test_output_flood import FLOOD, MIB, peak_rss
from tests.outstore.conftest import read_all

# serial: a flood of output: CPU-heavy, measures memory (as the SQLite floods)
pytestmark = [pytest.mark.serial, pytest.mark.timeout(150)]

BESIDE = 3  # tasks whose leases are renewed while the flood runs
# They outlast the flood (a few seconds): 4 s leases renewed every 0.5 s, lost if a renewal
# waits ~2.7 s (the deadline's margin) -- the task would then be killed and run again.
SLEEP = "sleep 12"
CAP = 20 * MIB


def test_a_150mb_flood_beside_running_tasks_is_capped_and_loses_no_lease(pg):
    beside = pg.push(*[SLEEP] * BESIDE)
    (flood,) = pg.push(FLOOD)
    metrics = pg.tmp / "metrics.prom"
    sup = pg.supervisor("--exit-when-empty", "-n", str(BESIDE + 1), "--task-output-max",
                        "20M", "--lock-duration", "4", "--renew-interval", "0.5",
                        "--metrics-file", str(metrics), "--metrics-interval", "1")
    peak = peak_rss(sup, timeout=120)
    assert sup.wait(30) == 0, sup.log()[-3000:]
    print(f"supervisor peak RSS {peak / MIB:.0f} MiB")

    store = PostgresOutputStore(pg.url, "jobq", create=False)
    try:
        data, complete = read_all(store, AttemptKey("default", flood, 1))
    finally:
        store.close()
    marker = TRUNCATED.format(limit=CAP).encode()
    assert complete
    assert data.endswith(marker) and data.count(marker) == 1
    assert len(data) == CAP + len(marker)
    assert set(data[:CAP]) <= {ord("x"), ord("\n")}

    log = sup.log()
    assert "lock lost" not in log.lower()
    for tid in [*beside, flood]:
        job = pg.job(tid)
        assert (job["state"], job["attempt"]) == ("succeeded", 1), job
    got = gauges(metrics)
    # 3 leases x 12 s / 0.5 s, the first renewal 0.5 s in: ~69; a stalled keeper far fewer
    assert got["jobq_lease_renewals_total"] >= BESIDE * 15, got
    assert got["jobq_lease_renewal_failures_total"] == 0, got
    assert peak < 300 * MIB
