"""Issue 15 item 5: the autoscaling gauges of the metrics file, from a real worker on SQLite:
queue depth and oldest pending age (sampled on the sampler thread), busy/total slots and tasks
in flight (main thread), parsed with prometheus-client's own parser."""

from __future__ import annotations

import signal
import time

import pytest

from tests.conftest import wait_for
from tests.integration.helpers import gauges

pytestmark = pytest.mark.timeout(90)


def test_gauges_follow_the_queue_and_the_slots(env):
    metrics = env.tmp / "jobq.prom"
    env.push(*["sleep 60"] * 5)
    pushed_at = time.time()
    sup = env.supervisor("-n", "2", "--metrics-file", str(metrics), "--metrics-interval", "0.2")

    def settled(depth: int) -> dict[str, float] | None:
        g = gauges(metrics)
        ok = (g.get("jobq_queue_depth") == depth and g.get("jobq_slots_busy") == 2
              and g.get("jobq_tasks_in_flight") == 2
              and g.get("jobq_queue_oldest_pending_age_seconds", 0) > 0)
        return g if ok else None

    g = wait_for(lambda: settled(3), 30, what=f"depth 3, 2 busy slots\n{gauges(metrics)}")
    assert isinstance(g, dict)
    assert g["jobq_slots_total"] == 2
    assert g["jobq_tasks_running"] == 2
    assert g["jobq_queue_oldest_pending_age_seconds"] <= time.time() - pushed_at + 1
    assert time.time() - 30 < g["jobq_queue_sampled_timestamp_seconds"] <= time.time()

    # Sampled again and again, not once: a new task shows up in the depth.
    env.push("sleep 60")
    wait_for(lambda: settled(4), 30, what=f"depth 4\n{gauges(metrics)}")

    sup.signal(signal.SIGTERM)  # both tasks requeued: all six pending again
    assert sup.wait(60) == 0
    statuses = [row[1] for row in env.rows()]
    assert statuses == ["pending"] * 6, statuses
    assert "queue (metrics sampler) unavailable" not in sup.log()
