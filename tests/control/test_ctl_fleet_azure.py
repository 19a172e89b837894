"""Issue 15, the jobq-ctl side on Azure Table Storage (Azurite's table service): the fleet
commands need no queue backend there (Service Bus here, never contacted), only the control
store named by --control-connection-string.  Each test uses a queue name of its own in the
shared ``jobqcontrol`` table."""

from __future__ import annotations

import json
import time
import uuid

import pytest

from supervisor.fleet.control.azure_table import AzureTableControlStore
from supervisor.fleet.control.records import TaskInfo, WorkerRecord
from tests.azurite import free_port, table_connection_string
from tests.control.conftest import azure_ctl
from tests.integration.helpers import one_error_line

pytestmark = pytest.mark.azure


@pytest.fixture
def azure(azurite_table):
    conn = table_connection_string(azurite_table)
    store = AzureTableControlStore(connection_string=conn)
    yield conn, "q" + uuid.uuid4().hex[:12], store
    store.close()


def record(queue: str, wid: str, now: float, beat_age: float = 0.0) -> WorkerRecord:
    task = TaskInfo(id="t-9", attempt=1, pid=77, started=now - 5, lease_expires=now + 300,
                    cmd="python train.py")
    return WorkerRecord(id=wid, queue=queue, host="vm1", pid=11, version="0.15.0",
                        state="running", slots_used=1, slots_total=2, started=now - 60,
                        heartbeat=now - beat_age, interval=15.0, tasks=(task,))


def test_workers_cancel_pause_drain_on_table_storage(azure):
    conn, queue, store = azure
    now = time.time()
    store.put_worker(record(queue, "vm1:11:ab", now))
    store.put_worker(record(queue, "vm2:12:cd", now, beat_age=60))
    res = azure_ctl(conn, queue, "workers", "--json")
    assert res.returncode == 0, res.stderr
    (w,) = json.loads(res.stdout)
    assert (w["id"], w["state"], w["slots"]) == ("vm1:11:ab", "running",
                                                 {"used": 1, "total": 2})
    assert w["tasks"][0]["id"] == "t-9" and w["tasks"][0]["lease_expires"].endswith("Z")
    lost = json.loads(azure_ctl(conn, queue, "workers", "--json", "--all").stdout)
    assert {x["id"]: x["state"] for x in lost}["vm2:12:cd"] == "lost"

    # no index of task ids on Azure: an id no producer makes is refused (issue 26), unless
    # --any-id (a hand-written body's id); it is recorded for the workers to meet
    line = one_error_line(azure_ctl(conn, queue, "cancel", "any-id"), 2)
    assert "'any-id' is not a task id" in line and "--any-id" in line
    assert store.get_cancel(queue, "any-id") is None
    res = azure_ctl(conn, queue, "cancel", "any-id", "--any-id", "--reason", "oops",
              "--cancel-ttl", "2d")
    assert res.returncode == 0, res.stderr
    assert "cancel recorded" in res.stdout
    cancel = store.get_cancel(queue, "any-id")
    assert cancel is not None and cancel.reason == "oops" and cancel.grace == 30.0

    assert azure_ctl(conn, queue, "pause").returncode == 0
    assert "PAUSED" in azure_ctl(conn, queue, "workers").stdout
    assert azure_ctl(conn, queue, "drain", "vm1:11:ab").returncode == 0
    snap = store.poll(queue, "vm1:11:ab")
    assert snap.flag is not None and snap.flag.paused
    assert [c.action for c in snap.commands] == ["drain"]
    assert [c.task_id for c in snap.cancels] == ["any-id"]
    assert "vm2:12:cd" in one_error_line(azure_ctl(conn, queue, "stop", "vm2:12:cd"), 1)
    assert azure_ctl(conn, queue, "resume").returncode == 0
    flag = store.poll(queue, "x").flag
    assert flag is not None and not flag.paused


def test_an_unreachable_table_service_is_exit_1_within_10_s(azure):
    _, queue, _ = azure
    dead = table_connection_string(free_port())  # nothing listens there
    for args in (["workers"], ["pause"], ["cancel", "a" * 32]):
        t0 = time.monotonic()
        res = azure_ctl(dead, queue, *args, timeout=30)
        assert time.monotonic() - t0 < 10
        assert "Traceback" not in res.stderr
        one_error_line(res, 1)


def test_service_bus_without_a_control_store_is_exit_2_naming_the_option(azure):
    _, queue, _ = azure
    for args in (["workers"], ["cancel", "f" * 32], ["pause"], ["drain", "w"]):
        line = one_error_line(azure_ctl(None, queue, *args), 2)
        assert "--control-account-url" in line


def test_short_ids_resolve_on_what_the_table_knows(azure):
    """Issue 30, 2: with no index of the queue's messages (Service Bus here), a prefix finds
    the tasks of the result and cancel records; one matching nothing is refused as before."""
    from supervisor.fleet.control.records import Cancel, ResultRecord

    conn, queue, store = azure
    now = time.time()
    ran, other = "c040527d" + "a" * 24, "c040527d" + "b" * 24
    store.put_results([ResultRecord(queue=queue, task_id=ran, attempt=n, outcome="failed",
                                    reason="", tail="", exit_status=1, worker="w", when=now)
                       for n in (1, 2, 3)])
    store.put_cancel(Cancel(queue=queue, task_id=other, reason="", who="op", when=now))
    assert store.task_ids(queue, "c040527d", 6) == [ran, other]
    res = azure_ctl(conn, queue, "cancel", "c040527da")
    assert res.returncode == 0 and res.stdout.startswith(f"{ran}: cancel recorded"), res.stderr
    assert store.get_cancel(queue, ran) is not None
    line = one_error_line(azure_ctl(conn, queue, "result", "c040527d"), 2)
    assert f"ambiguous in queue {queue}: {ran}, {other}" in line
    line = one_error_line(azure_ctl(conn, queue, "cancel", "0123456789ab"), 2)
    assert "'0123456789ab' is not a task id" in line
    assert store.get_cancel(queue, "0123456789ab") is None
