"""Acceptance 4 of issue 15 on a Storage Queue worker: its control store (Azurite's table
service, named by the queue's own connection string through a black-holing loopback proxy)
goes silent while a task longer than the visibility timeout runs.  The message stays hidden
(a second worker polling the same queue never gets it), the task finishes once, nothing is
killed, the outage is logged once (rate-limited to one line a minute), and after the proxy
opens again a cancel written then is acted on."""

from __future__ import annotations

import signal
import time

import pytest

from supervisor.fleet.control import Cancel
from supervisor.fleet.control.azure_table import AzureTableControlStore
from tests.azurite import table_connection_string
from tests.conftest import wait_for
from tests.faults.proxy import FaultProxy

pytestmark = [pytest.mark.azure, pytest.mark.timeout(180)]

# A 6 s lock renewed each second leaves a renewal 3 s (lock - margin - interval) before the
# kill deadline.  With a 3 s lock it had 1 s, and a renewal Azurite answers later than that on
# a saturated CPU is applied unseen: the next one's pop receipt is stale, the lease rightly
# lost -- a failure of the machine, not of what this test is about.
LOCK = 6
LEASE = ("--visibility-timeout", str(LOCK), "--renew-interval", "1", "--poll-interval", "0.2")


def test_black_holed_table_service_never_touches_storage_queue_leases(
        sq, azurite_table):
    direct = AzureTableControlStore(connection_string=table_connection_string(azurite_table))
    proxy = FaultProxy(("127.0.0.1", azurite_table))
    # one connection string, both services: the queue direct, the tables through the proxy
    conn = f"{sq.conn_str};TableEndpoint=http://127.0.0.1:{proxy.port}/devstoreaccount1"
    control_env = {"JOBQ_CONNECTION_STRING": conn}
    runs, done = sq.tmp / "runs", sq.tmp / "done"
    try:
        (long_id,) = sq.ctl("push", "-c", f"echo $JOBQ_TASK_ID >> {runs}; sleep 20; "
                            f"touch {done}").stdout.split()
        sup = sq.supervisor("--worker-id", "w-out", *LEASE, "--control-interval", "1",
                            "--heartbeat-interval", "1", env=control_env, name="w-out")
        wait_for(lambda: any(w.id == "w-out" and w.tasks for w in direct.workers(sq.queue)),
                 30, what="worker record through the proxy")
        # A witness with no control plane: were the message to become visible again (a
        # renewal missed), it would receive it and run it a second time.
        witness = sq.supervisor("--worker-id", "w-witness", "--control", "off", *LEASE,
                                env=control_env, name="w-witness")
        proxy.blackhole()
        t_hole = time.monotonic()
        sup.wait_log("control store unavailable", 30)
        wait_for(done.exists, 60, what="the long task finishing on its own")
        assert time.monotonic() - t_hole > 2 * LOCK, "the task outlived 2 visibility timeouts"
        wait_for(lambda: sq.count() == 0, 30, what="the finished task's message deleted")
        assert runs.read_text().split() == [long_id], "ran once, never handed out again"
        proxy.restore()
        sup.wait_log("control store reachable again", 90)
        log = sup.log()
        assert log.count("control store unavailable") == 1, "logged once a minute at most"
        for bad in ("SIGTERM", "SIGKILL", "lock lost", "lease lost"):
            assert bad not in log, bad
        assert "succeeded" in log or "finished" in log

        # recovered: a cancel written now reaches the running task
        witness.signal(signal.SIGTERM)
        assert witness.wait(30) == 0
        assert long_id not in witness.log()
        term, ready = sq.tmp / "term", sq.tmp / "ready"
        (cancel_id,) = sq.ctl("push", "-c", f"trap 'touch {term}; exit 0' TERM; touch {ready}; "
                              "while true; do sleep 0.1; done").stdout.split()
        wait_for(ready.exists, 30, what="second task running")
        direct.put_cancel(Cancel(queue=sq.queue, task_id=cancel_id, reason="after outage",
                                 who="ops", when=time.time(), grace=30.0))
        wait_for(term.exists, 30, what="the cancel acted on after recovery")
        wait_for(lambda: sq.count() == 0, 30, what="the cancelled task settled")
        sup.signal(signal.SIGTERM)
        assert sup.wait(30) == 0
        assert not [w for w in direct.workers(sq.queue) if w.id == "w-out"]
    finally:
        proxy.close()
        direct.close()
