"""Issue 15 on a Storage Queue worker (Azurite's queue service) whose control store is Azure
Table Storage (Azurite's table service): worker record, cancel of a running task and of a
task before any worker received it, of a task ignoring SIGTERM (killed at the grace), and the
autoscaling gauges sampled from the queue."""

from __future__ import annotations

import json
import signal
import time

import pytest

from supervisor.fleet.control import Cancel
from tests.conftest import marked_processes, term_stamp, wait_for
from tests.integration.helpers import cancel_dies_at_grace, gauges

pytestmark = [pytest.mark.azure, pytest.mark.timeout(120)]

FAST = ("--control-interval", "1", "--heartbeat-interval", "1", "--poll-interval", "0.2")


@pytest.mark.timing  # times the cancel
def test_cancel_on_storage_queue_running_and_before_receive(sq, table):
    store, control_env = table
    marker, ready, ran = (sq.tmp / n for n in ("term", "ready", "ran"))
    (running_id,) = sq.ctl("push", "-c", f"{term_stamp(marker)}; "
                           f"echo tail-line; touch {ready}; while true; do sleep 0.1; done"
                           ).stdout.split()
    (early_id,) = sq.ctl("push", "-c", f"touch {ran}").stdout.split()
    store.put_cancel(Cancel(queue=sq.queue, task_id=early_id, reason="never", who="ops",
                            when=time.time(), grace=30.0))
    sup = sq.supervisor("--worker-id", "w-sq", *FAST, env=control_env)
    wait_for(ready.exists, 30, what="task running")
    wait_for(lambda: [t.id for w in store.workers(sq.queue) for t in w.tasks] == [running_id],
             15, what="worker record with the running task")
    # jobq-ctl status names the worker of each running task, from the worker records
    status = json.loads(sq.ctl("status", "--json", env=control_env).stdout)
    assert [(r["id"], r["worker"]) for r in status["running"]] == [(running_id, "w-sq")], status
    assert running_id in sq.ctl("status", env=control_env).stdout
    t0 = time.time()
    store.put_cancel(Cancel(queue=sq.queue, task_id=running_id, reason="stop it", who="ops",
                            when=t0, grace=30.0))
    wait_for(marker.exists, 10, what="SIGTERM marker")
    assert float(marker.read_text()) - t0 < 1.0 + 2.0
    wait_for(lambda: len(sq.failed_records()) == 2, 30, what="both in the failed queue")
    records = {r["id"]: r for r in sq.failed_records()}
    assert records[running_id]["reason"].startswith("cancelled by ops")
    assert "tail-line" in records[running_id]["output_tail"]
    assert records[early_id]["reason"].startswith("cancelled by ops")
    assert not ran.exists(), "a task cancelled before it was received never runs"
    wait_for(lambda: len(store.results(sq.queue, "cancelled")) == 2, 15, what="results")
    sup.signal(signal.SIGTERM)
    assert sup.wait(30) == 0
    assert sq.count() == 0, "a cancelled task is not retried"
    assert not store.workers(sq.queue), "the record is deleted on a clean exit"


def test_cancel_of_a_task_ignoring_sigterm_on_storage_queue_dies_at_the_grace(sq, table):
    store, control_env = table
    ready = sq.tmp / "ready"
    (task_id,) = sq.ctl("push", "-c", f"trap '' TERM; touch {ready}; sleep 600 & wait; "
                        f"sleep 600").stdout.split()
    sup = sq.supervisor("--worker-id", "w-sq-g", *FAST, env=control_env)
    wait_for(ready.exists, 30, what="task running")
    procs = [p for p in marked_processes() if p.pid != sup.pid]
    assert procs
    cancel_dies_at_grace(sup, store, sq.queue, task_id, procs, grace=2.0)
    wait_for(lambda: len(sq.failed_records()) == 1, 30, what="the failed record")
    assert sq.failed_records()[0]["reason"].startswith("cancelled by ops")
    sup.signal(signal.SIGTERM)
    assert sup.wait(30) == 0
    assert sq.count() == 0, "a cancelled task is not retried"
    assert sup.log().count("started pid=") == 1


def test_autoscaling_gauges_on_storage_queue(sq):
    """The first sample is taken at once; later ones every 15 s at the least (not waited)."""

    metrics = sq.tmp / "jobq.prom"
    ready = sq.tmp / "ready"
    sq.ctl("push", "-c", f"touch {ready}; sleep 600", "-c", "sleep 600", "-c", "sleep 600")
    sup = sq.supervisor("--metrics-file", str(metrics), "--metrics-interval", "0.2",
                        "--control", "off", "--poll-interval", "0.2")
    wait_for(ready.exists, 30, what="task running")

    def sampled() -> bool:
        g = gauges(metrics)
        return "jobq_queue_depth" in g and g.get("jobq_slots_busy") == 1

    wait_for(sampled, 30, what=f"a queue sample\n{gauges(metrics)}")
    g = gauges(metrics)
    assert g["jobq_queue_depth"] == 3  # the service's count holds the running task's message
    assert g["jobq_queue_oldest_pending_age_seconds"] >= 0  # present: one peek tells it
    assert g["jobq_slots_total"] == 1 and g["jobq_tasks_in_flight"] == 1
    sup.signal(signal.SIGTERM)
    assert sup.wait(30) == 0
