"""Acceptance 4 of issue 15 on the worker: its control store (Azurite's table service behind a
black-holing loopback proxy; the queue itself is SQLite, so the fault hits only the control
path) goes silent while a task runs.  Every lease is still renewed, no task is killed, the
outage is logged rate-limited, and the worker recovers when traffic flows again (the result
record it could not write meanwhile is written then)."""

from __future__ import annotations

import signal
import time

import pytest

from supervisor.fleet.control.azure_table import AzureTableControlStore
from tests.azurite import table_connection_string
from tests.conftest import wait_for
from tests.faults.proxy import FaultProxy

pytestmark = pytest.mark.timeout(120)


def test_black_holed_control_store_never_touches_the_data_plane(env, azurite_table):
    direct = AzureTableControlStore(connection_string=table_connection_string(azurite_table))
    proxy = FaultProxy(("127.0.0.1", azurite_table))
    try:
        done = env.tmp / "done"
        (task_id,) = env.push(f"sleep 14; touch {done}")
        sup = env.supervisor(
            "--worker-id", "w-out", "--lock-duration", "3", "--renew-interval", "1",
            "--control-interval", "1", "--heartbeat-interval", "1",
            env={"JOBQ_CONTROL_CONNECTION_STRING": table_connection_string(proxy.port)})
        wait_for(lambda: any(w.id == "w-out" and w.tasks for w in direct.workers("default")),
                 30, what="worker record through the proxy")
        proxy.blackhole()
        t_hole = time.time()
        leases: set[float] = set()

        def renewed_during_outage() -> bool:
            until = env.job(task_id)["locked_until"]
            if until is not None and until > t_hole + 3.5:
                leases.add(until)
            return len(leases) >= 3

        wait_for(renewed_during_outage, 15, what="renewals while the control store is down")
        sup.wait_log("control store unavailable", 30)
        wait_for(done.exists, 30, what="the task finishing on its own")
        # The task touched its file just before exiting; the settlement follows a moment later.
        wait_for(lambda: env.job(task_id)["status"] != "running", 30, what="the task settled")
        assert env.job(task_id)["status"] == "succeeded"
        assert env.job(task_id)["attempt"] == 1
        proxy.restore()
        sup.wait_log("control store reachable again", 90)
        # its result record waited for the store, and came with it
        wait_for(lambda: [(r.outcome, r.final) for r in direct.results_of("default", task_id)]
                 == [("succeeded", True)], 30, what="the result record after the outage")
        log = sup.log()
        assert log.count("control store unavailable") == 1, "logged once a minute at most"
        assert "SIGTERM" not in log and "SIGKILL" not in log and "lock lost" not in log
        sup.signal(signal.SIGTERM)
        assert sup.wait(30) == 0
        assert not [w for w in direct.workers("default") if w.id == "w-out"]
    finally:
        proxy.close()
        direct.close()
