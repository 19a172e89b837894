"""Issue 26, section 4: the dashboard over HTTP (the Flask test client) on a Storage Queue
worker's Azurite queue, with its control store in Azurite's table service: the depth chart
draws the count the backend reports (``queued``) under its word; a pending task opens (found
by a peek, 32 messages at most) and can be cancelled; a running task's environment names show
with masked values."""

from __future__ import annotations

import re

import pytest

from supervisor.backends.storage_queue.backend import StorageQueueBackend
from supervisor.dashboard.app import create_app
from supervisor.dashboard.data import MASK, DataSource
from supervisor.dashboard.history import History, Sampler
from supervisor.fleet.control.azure_table import AzureTableControlStore
from tests.azurite import table_connection_string
from tests.conftest import wait_for
from tests.dashboard.conftest import TOKEN
from tests.dashboard.pages import client_login, csrf_of

pytestmark = [pytest.mark.azure, pytest.mark.timeout(120)]
FAST = ("--control-interval", "1", "--heartbeat-interval", "1", "--poll-interval", "0.2")


def _data(sq, table_port: int | None = None) -> DataSource:
    conn = table_connection_string(table_port) if table_port else None
    return DataSource(
        sq.queue, lambda: StorageQueueBackend(sq.queue, connection_string=sq.conn_str,
                                              create=False),
        lambda: AzureTableControlStore(connection_string=conn) if conn else None)


def test_the_depth_chart_draws_what_storage_queue_counts_under_its_word(sq):
    sq.push("true", "true", "true")
    data = _data(sq)
    history = History()
    sampler = Sampler(data, history)
    sampler.sample_once()
    page = create_app(data, history).test_client().get("/").get_data(as_text=True)
    chart = page[page.index('id="depth"'):]
    chart = chart[:chart.index("</figure>")]
    # the one line drawn is "queued", at the scale's top (3 of 3): not a flat 0 "pending"
    assert re.findall(r'<polyline class="(\w+)"', chart) == ["queued"]
    assert 'class="chart-top">3<' in chart
    (y,) = re.findall(r'class="dot queued" x1="[\d.]+" y1="([\d.]+)"', chart)
    assert float(y) == 4.0, "the latest value drawn is 3, the top of the scale"
    legend = re.sub(r"<[^>]+>", "", chart[chart.index("<figcaption>"):]).split()
    assert legend == ["queued"], "the legend says the backend's word, and only it"
    data.close_thread()


def test_a_pending_task_opens_from_a_peek_and_is_cancelled(sq, azurite_table):
    ran = sq.tmp / "ran"
    (task_id,) = sq.push(f"touch {ran}", extra=("--env", "API_TOKEN=hunter2-value",
                                               "--env", "MODE=fast"))
    data = _data(sq, azurite_table)
    client = create_app(data, token=TOKEN).test_client()
    found = client.get(f"/api/task/{task_id}")
    assert found.status_code == 200, found.get_data(as_text=True)
    task = found.get_json()
    assert (task["state"], task["cmd"], task["worker"]) == ("pending", f"touch {ran}", None)
    assert task["env"] == {"API_TOKEN": MASK, "MODE": "fast"}  # only a secret name masked
    missing = client.get("/api/task/no-such-task-26").get_json()["error"]
    assert "first 32 messages" in missing, "a 404 says how far a peek sees"
    assert client_login(client) == 302
    page = client.get(f"/tasks/{task_id}").get_data(as_text=True)
    assert 'id="cancel"' in page and "hunter2-value" not in page
    resp = client.post(f"/tasks/{task_id}/cancel",
                       data={"csrf": csrf_of(client), "back": f"/tasks/{task_id}"})
    assert resp.status_code == 302, resp.get_data(as_text=True)
    store = AzureTableControlStore(connection_string=table_connection_string(azurite_table))
    try:
        (cancel,) = store.cancels(sq.queue)
    finally:
        store.close()
    assert (cancel.task_id, cancel.who) == (task_id, "alice@dashboard")
    # no worker claimed it (task_ends.SETTLE): shown cancelled while it waits to be taken off
    task = wait_for(lambda: (t := client.get(f"/api/task/{task_id}").get_json())["state"]
                    == "cancelled" and t, 30, what="the task shown cancelled")
    assert task["cmd"] == f"touch {ran}" and task["reason"].startswith("cancelled by alice")
    data.close_thread()
    # the worker that receives it fails it as cancelled, without running it
    sup = sq.supervisor(*FAST, "--exit-when-empty", env={
        "JOBQ_CONTROL_CONNECTION_STRING": table_connection_string(azurite_table)})
    assert sup.wait(60) == 0, sup.log()[-3000:]
    (record,) = sq.failed_records()
    assert record["id"] == task_id and record["reason"].startswith("cancelled by alice@dashboard")
    assert not ran.exists()


def test_a_running_tasks_environment_names_show_masked(sq, azurite_table):
    release = sq.tmp / "release"
    (task_id,) = sq.push(f"while [ ! -e {release} ]; do sleep 0.1; done",
                         extra=("--env", "API_TOKEN=hunter2-value", "--env", "MODE=fast"))
    sup = sq.supervisor("--worker-id", "w-env", *FAST, env={
        "JOBQ_CONTROL_CONNECTION_STRING": table_connection_string(azurite_table)})
    data = _data(sq, azurite_table)
    client = create_app(data).test_client()
    try:
        def running() -> dict | None:
            resp = client.get(f"/api/task/{task_id}")
            task = resp.get_json() if resp.status_code == 200 else None
            # the worker's record (its first heartbeat), not only the attempt's record
            return task if task and task["worker"] else None
        task = wait_for(running, 40, what="the task running in its worker's record")
        assert (task["state"], task["worker"]) == ("running", "w-env")
        # a worker record names the variables, not their values
        assert task["env"] == {"API_TOKEN": MASK, "MODE": MASK}
        assert "hunter2-value" not in client.get(f"/tasks/{task_id}").get_data(as_text=True)
    finally:
        release.touch()
        data.close_thread()
    sup.stop()


def test_the_tasks_page_lists_what_a_peek_and_the_records_show(sq, azurite_table):
    """Issue 30 (1) on a queue with no index of its tasks: pending ones from a peek, finished
    ones from the control store's final result records, and a note that says so."""
    from supervisor.fleet.control.records import ResultRecord

    pending = sq.push("echo first", "echo second")
    data = _data(sq, azurite_table)
    data.store().put_results([ResultRecord(
        queue=sq.queue, task_id="f" * 32, attempt=2, outcome="failed", reason="exit status 3",
        tail="", exit_status=3, worker="w-9", when=1000.0, started=990.0, finished=1000.0,
        final=True, max_attempts=2)])
    client = create_app(data).test_client()
    api = client.get("/api/tasks").get_json()
    assert "first 32 messages" in api["note"]
    assert {t["id"]: t["state"] for t in api["tasks"]} == {
        pending[0]: "pending", pending[1]: "pending", "f" * 32: "failed"}
    failed = client.get("/api/tasks?state=failed").get_json()["tasks"]
    assert [(t["id"], t["worker"], t["exit_status"], t["attempt"]) for t in failed] == [
        ("f" * 32, "w-9", 3, 2)]
    assert [t["id"] for t in client.get("/api/tasks?q=SECOND").get_json()["tasks"]] == \
        [pending[1]]
    page = client.get("/tasks").get_data(as_text=True)
    assert 'id="tasks-note"' in page and "f" * 32 in page
    assert client.get("/tasks?after=nope").status_code == 400
    data.close_thread()
