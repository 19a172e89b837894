"""Issue 26, section 3, on the worker: the control store (Azurite's table service behind a
black-holing loopback proxy; the queue is SQLite, so only the control path is cut) goes
silent for ~20 s while tasks finish.  The first result record of the outage wakes the
control thread; such a wake-up makes no store call and so must not be taken for the end of the
outage: "control store reachable again" appears only once the proxy passes traffic again,
and once."""

from __future__ import annotations

import signal
import time

import pytest

from supervisor.fleet.control.azure_table import AzureTableControlStore
from tests.azurite import table_connection_string
from tests.conftest import Env, wait_for
from tests.faults.proxy import FaultProxy

pytestmark = [pytest.mark.azure, pytest.mark.timeout(150)]
OUTAGE = 20.0  # s, the was 22


def test_recovery_is_logged_once_and_only_after_traffic_flows_again(env: Env, azurite_table):
    direct = AzureTableControlStore(connection_string=table_connection_string(azurite_table))
    proxy = FaultProxy(("127.0.0.1", azurite_table))
    sup = None
    try:
        # They end during the outage, when no result record waits: the first record of the
        # outage wakes the control thread (a later one finds the outbox non-empty: no wake).
        ids = env.push("sleep 8", "sleep 9")
        sup = env.supervisor(
            "--worker-id", "w-truth", "-n", "2", "--control-interval", "1",
            "--heartbeat-interval", "1",
            env={"JOBQ_CONTROL_CONNECTION_STRING": table_connection_string(proxy.port)})
        wait_for(lambda: all([r.outcome for r in direct.results_of("default", t)]
                             == ["running"] for t in ids), 30,
                 what="both running records through the proxy: nothing waits to be written")
        proxy.blackhole()
        sup.wait_log("control store unavailable", 30)
        time.sleep(OUTAGE)  # the outage itself: nothing to wait for but its length
        during = sup.log()
        assert all(env.job(t)["status"] == "succeeded" for t in ids), \
            "the tasks must have ended (and woken the control thread) during the outage"
        proxy.restore()
        assert "reachable again" not in during, during
        sup.wait_log("control store reachable again", 60)
        wait_for(lambda: all(env.job(t)["status"] == "succeeded" for t in ids), 60,
                 what="every task done")
        # a few more heartbeats after the last task: a second "again" line would be there
        later = time.time() + 3
        wait_for(lambda: any(w.id == "w-truth" and w.heartbeat > later
                             for w in direct.workers("default")), 30,
                 what="heartbeats after the outage")
        log = sup.log()
        assert log.count("reachable again") == 1, log
        assert log.count("control store unavailable") == 1  # logged once a minute at most
        sup.signal(signal.SIGTERM)
        assert sup.wait(30) == 0
    finally:
        proxy.close()
        direct.close()
