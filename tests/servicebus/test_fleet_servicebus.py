"""Issue 15 on a Service Bus worker (the project's AMQP test broker) with its control store in
Azure Table Storage (Azurite's table service, given by JOBQ_CONTROL_CONNECTION_STRING): cancel
of a running task, of one before any worker received it, and of one ignoring SIGTERM (killed at
the grace); the autoscaling gauges sampled from the queue."""

from __future__ import annotations

import json
import signal
import time

import pytest

from supervisor.fleet.control import Cancel
from supervisor.fleet.control.azure_table import AzureTableControlStore
from tests.azurite import table_connection_string
from tests.conftest import marked_processes, term_stamp, wait_for
from tests.integration.helpers import cancel_dies_at_grace, gauges

pytestmark = [pytest.mark.servicebus, pytest.mark.timeout(120)]

FAST = ("--control-interval", "1", "--heartbeat-interval", "1")


@pytest.fixture(autouse=True)
def own_queue(sb_env) -> None:
    """A queue name of the test's own: the control store (azurite_table) is the session's,
    and the records another test left for the same name (its results, its workers) showed
    here (a succeeded task of another test on the tasks page, found in a CI run)."""
    sb_env.queue = f"q-{sb_env.token[:12]}"


@pytest.mark.timing  # times the cancel
def test_cancel_on_servicebus_running_and_before_receive(sb_env, azurite_table):
    conn = table_connection_string(azurite_table)
    store = AzureTableControlStore(connection_string=conn)
    try:
        q = sb_env.queue
        marker, ready, ran = (sb_env.tmp / n for n in ("term", "ready", "ran"))
        (running_id,) = sb_env.push(f"{term_stamp(marker)}; echo tail; "
                                    f"touch {ready}; while true; do sleep 0.1; done")
        (early_id,) = sb_env.push(f"touch {ran}")
        store.put_cancel(Cancel(queue=q, task_id=early_id, reason="never", who="ops",
                                when=time.time(), grace=30.0))
        sup = sb_env.supervisor("--worker-id", "w-sb", *FAST,
                                env={"JOBQ_CONTROL_CONNECTION_STRING": conn})
        wait_for(ready.exists, 30, what="task running")
        # jobq-ctl status names the worker of each running task, from the worker records
        ctl_env = {"JOBQ_CONTROL_CONNECTION_STRING": conn}

        def running() -> list[tuple[str, str]]:
            status = json.loads(sb_env.ctl("status", "--json", env=ctl_env).stdout)
            return [(r["id"], r["worker"]) for r in status["running"]]
        wait_for(lambda: running() == [(running_id, "w-sb")], 15,
                 what="status --json naming the worker of the running task")
        assert running_id in sb_env.ctl("status", env=ctl_env).stdout
        t0 = time.time()
        store.put_cancel(Cancel(queue=q, task_id=running_id, reason="stop it", who="ops",
                                when=t0, grace=30.0))
        wait_for(marker.exists, 10, what="SIGTERM marker")
        assert float(marker.read_text()) - t0 < 1.0 + 2.0
        wait_for(lambda: len(sb_env.failed_json()) == 2, 30, what="both dead-lettered")
        records = {r["id"]: r for r in sb_env.failed_json()}
        assert records[running_id]["reason"].startswith("cancelled by ops")
        assert records[early_id]["reason"].startswith("cancelled by ops")
        assert not ran.exists(), "a task cancelled before it was received never runs"
        sup.signal(signal.SIGTERM)
        assert sup.wait(30) == 0
        assert sb_env.ctl("size").stdout.strip() == "0", "a cancelled task is not retried"
        assert not store.workers(q), "the record is deleted on a clean exit"
    finally:
        store.close()


def test_cancel_of_a_task_ignoring_sigterm_on_servicebus_dies_at_the_grace(sb_env,
                                                                          azurite_table):
    conn = table_connection_string(azurite_table)
    store = AzureTableControlStore(connection_string=conn)
    try:
        q, ready = sb_env.queue, sb_env.tmp / "ready"
        (task_id,) = sb_env.push(f"trap '' TERM; touch {ready}; sleep 600 & wait; sleep 600")
        sup = sb_env.supervisor("--worker-id", "w-sb-g", *FAST,
                                env={"JOBQ_CONTROL_CONNECTION_STRING": conn})
        wait_for(ready.exists, 30, what="task running")
        procs = [p for p in marked_processes() if p.pid != sup.pid]
        assert procs
        cancel_dies_at_grace(sup, store, q, task_id, procs, grace=2.0)
        wait_for(lambda: len(sb_env.failed_json()) == 1, 30, what="dead-lettered")
        assert sb_env.failed_json()[0]["reason"].startswith("cancelled by ops")
        sup.signal(signal.SIGTERM)
        assert sup.wait(30) == 0
        assert sb_env.ctl("size").stdout.strip() == "0", "a cancelled task is not retried"
        assert sup.log().count("started pid=") == 1
    finally:
        store.close()


def test_autoscaling_gauges_on_servicebus(sb_env):
    """Depth from the broker's count (locked messages included); no age series: Service Bus
    cannot tell it without receiving."""

    metrics, ready = sb_env.tmp / "jobq.prom", sb_env.tmp / "ready"
    sb_env.push(f"touch {ready}; sleep 600", "sleep 600", "sleep 600")
    sup = sb_env.supervisor("--metrics-file", str(metrics), "--metrics-interval", "0.2",
                            "--control", "off")
    wait_for(ready.exists, 30, what="task running")
    wait_for(lambda: "jobq_queue_depth" in gauges(metrics)
             and gauges(metrics).get("jobq_slots_busy") == 1, 30,
             what=f"a queue sample\n{gauges(metrics)}")
    g = gauges(metrics)
    assert g["jobq_queue_depth"] == 3
    assert "jobq_queue_oldest_pending_age_seconds" not in g
    assert g["jobq_slots_total"] == 1
    sup.signal(signal.SIGTERM)
    assert sup.wait(30) == 0
    assert "queue (metrics sampler) unavailable" not in sup.log()


def test_a_retry_on_servicebus_says_it_is_back_on_the_queue_now(sb_env, azurite_table):
    """Issue 26: --retry-delay is not applied on Service Bus (abandon is immediate), so the
    log line and the attempt's result record say so instead of "will retry in 10s"."""
    conn = table_connection_string(azurite_table)
    ctl_env = {"JOBQ_CONTROL_CONNECTION_STRING": conn}
    seen = sb_env.tmp / "seen"
    (task_id,) = sb_env.push(f"if [ -e {seen} ]; then exit 0; fi; touch {seen}; exit 3")
    sup = sb_env.supervisor("--worker-id", "w-retry", *FAST, "--retry-delay", "10",
                            "--exit-when-empty", env=ctl_env)
    assert sup.wait(60) == 0, sup.log()[-3000:]
    now = "back on the queue now (Service Bus applies no retry delay)"
    log = sup.log()
    assert f"will retry: {now} (attempt 1 of 5 failed)" in log
    assert "will retry in" not in log and "retried in" not in log
    first, second = json.loads(sb_env.ctl("result", task_id, "--json", env=ctl_env).stdout)
    assert (first["attempt"], first["state"], first["exit_status"]) == (1, "failed", 3)
    assert first["reason"] == f"exit status 3; {now}"
    assert (second["attempt"], second["state"]) == (2, "succeeded")
