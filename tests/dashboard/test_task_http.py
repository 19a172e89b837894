"""The task and failed pages over plain HTTP (no browser): the output API (offsets, the size
cap, whole lines, the jump to the tail), bad input, an output store that is down, and the
cancel / requeue / clear actions -- a real ``jobq-ctl dashboard`` process where the wiring
matters, the Flask test client where a store must fail on cue.  Those with ``fenv`` run on
SQLite and on PostgreSQL (its control and output stores in the same database)."""

from __future__ import annotations

import json
import re
import time

import pytest

from supervisor.dashboard.app import create_app
from supervisor.dashboard.tasks import CAP
from supervisor.fleet.control.records import ResultRecord, WorkerRecord
from supervisor.fleet.output.base import AttemptKey, OutputStore, OutputStoreError
from supervisor.fleet.output.open import open_output_store
from tests.dashboard.conftest import TOKEN, Unreachable, control_store, data_source
from tests.dashboard.pages import client_login, csrf_of, get

pytestmark = pytest.mark.timeout(90)
Q = "default"


def _output(e) -> OutputStore:
    store = open_output_store(e.settings())
    assert store is not None
    return store


def _out(client, task_id: str, attempt: int = 1, offset: int | None = None) -> dict:
    url = f"/api/task/{task_id}/output?attempt={attempt}"
    resp = client.get(url + ("" if offset is None else f"&offset={offset}"))
    assert resp.status_code == 200, resp.data
    return resp.get_json()


def test_output_api_sends_the_tail_then_what_follows_in_whole_lines(fenv):
    (task_id,) = fenv.push("true")
    store = _output(fenv)
    key = AttemptKey(Q, task_id, 1)
    line = b"x" * 99 + b"\n"
    for _ in range(10):  # 1,000,000 bytes, far more than one call may send
        store.append(key, line * 1000)
    client = create_app(data_source(fenv)).test_client()
    first = _out(client, task_id)
    assert 0 < len(first["data"]) <= CAP and first["next_offset"] == 1_000_000
    assert first["skipped"] == first["offset"] > 1_000_000 - CAP
    assert first["data"].startswith("x" * 99 + "\n"), "whole lines after the jump"
    assert first["complete"] is False
    store.append(key, b"<b>new</b> line\npartial")
    nxt = _out(client, task_id, offset=first["next_offset"])
    assert nxt["data"] == "<b>new</b> line\n" and nxt["skipped"] == 0
    store.append(key, b" end\n")
    store.finish(key)
    last = _out(client, task_id, offset=nxt["next_offset"])
    assert last["data"] == "partial end\n" and last["complete"] is True
    behind = _out(client, task_id, offset=0)  # a reader far behind jumps to the tail
    assert behind["skipped"] > 0 and len(behind["data"]) <= CAP
    assert behind["next_offset"] == 1_000_000 + len(b"<b>new</b> line\npartial end\n")
    assert behind["complete"] is True
    none = _out(client, task_id, attempt=2)
    assert none == {**none, "data": "", "complete": False, "offset": 0, "skipped": 0}


def test_task_page_shows_attempts_with_their_result_records(fenv):
    (task_id,) = fenv.push("echo hi")
    store = control_store(fenv)
    try:
        store.put_result(ResultRecord(
            queue=Q, task_id=task_id, attempt=1, outcome="cancelled", reason="by test",
            tail="", exit_status=None, signal=15, worker="w-x", when=100.0, started=90.0,
            finished=100.0, final=True, max_attempts=3, cancelled_by="bob@host"))
    finally:
        store.close()
    _output(fenv).append(AttemptKey(Q, task_id, 1), b"hi\n")
    client = create_app(data_source(fenv)).test_client()
    html = client.get(f"/tasks/{task_id}").get_data(as_text=True)
    row = html[html.index('data-attempt="1"'):]
    row = row[:row.index("</tr>")]
    for text in ("1/3", "cancelled", "killed by SIGTERM", "w-x", "bob@host", "by test", "10s"):
        assert text in row, text
    assert f"jobq-ctl logs {task_id} --attempt 1" in html
    assert f'data-url="/api/task/{task_id}/output?attempt=1"' in html
    api = client.get(f"/api/task/{task_id}").get_json()
    assert api["attempts"][0]["cancelled_by"] == "bob@host"
    _output(fenv).append(AttemptKey(Q, task_id, 2), b"again\n")
    html = client.get(f"/tasks/{task_id}").get_data(as_text=True)
    assert f'data-url="/api/task/{task_id}/output?attempt=2"' in html, "the latest by default"
    assert f'href="/tasks/{task_id}?attempt=1"' in html
    html = client.get(f"/tasks/{task_id}?attempt=1").get_data(as_text=True)
    assert f'data-url="/api/task/{task_id}/output?attempt=1"' in html
    assert f'href="/tasks/{task_id}?attempt=2"' in html
    for bad in ("0", "x", "-1"):
        assert client.get(f"/tasks/{task_id}?attempt={bad}").status_code == 400


def test_task_page_shows_what_the_message_says_and_masks_only_secret_names(fenv):
    (task_id,) = fenv.push("echo hi", extra=(
        "--env", "MODE=prod", "--env", "API_TOKEN=s3cr3t", "--env", "DB_PASSWORD=hunter2",
        "--cwd", "/srv/work", "--priority", "7", "--timeout", "90s", "--delay", "1h",
        "--max-attempts", "4", "--unique-key", "nightly"))
    client = create_app(data_source(fenv)).test_client()
    html = client.get(f"/tasks/{task_id}").get_data(as_text=True)
    assert "<code>MODE=prod</code>" in html, "a value whose name is not secret is shown"
    assert "s3cr3t" not in html and "hunter2" not in html
    assert "<code>API_TOKEN=********</code>" in html
    for fact, text in (("cwd", "/srv/work"), ("priority", "7"), ("timeout", "1m30s"),
                       ("max-attempts", "4"), ("unique-key", "nightly")):
        assert re.search(f'id="task-{fact}">{text}<', html), fact
    assert re.search(r'id="task-not-before">\d{4}-\d\d-\d\dT', html)
    api = client.get(f"/api/task/{task_id}").get_json()
    assert (api["priority"], api["timeout_s"], api["max_attempts"]) == (7, 90.0, 4)
    assert api["env"] == {"MODE": "prod", "API_TOKEN": "********", "DB_PASSWORD": "********"}


def test_unknown_task_is_404_and_malformed_output_queries_400(fenv, dashboard):
    (task_id,) = fenv.push("true")
    d = dashboard()
    for path in ("/tasks/no-such-task", "/api/task/no-such-task",
                 "/api/task/no-such-task/output?attempt=1"):
        code, body = get(d.url + path)
        assert code == 404 and "Traceback" not in body, path
    base = f"/api/task/{task_id}/output"
    for query in ("", "?attempt=", "?attempt=0", "?attempt=x", "?attempt=1&offset=-1",
                  "?attempt=1&offset=1e3", "?attempt=99999999999999999999",
                  "?attempt=1&offset=%3Cscript%3E"):
        code, body = get(d.url + base + query)
        assert code == 400, query
        assert "error" in json.loads(body) and "<script>" not in body
    code, body = get(d.url + base + "?attempt=1&offset=0")
    assert code == 200 and json.loads(body)["data"] == ""
    assert get(d.url + "/failed")[0] == 200


def test_without_token_the_task_actions_are_403(fenv, dashboard):
    (task_id,) = fenv.push("true")
    d = dashboard()
    for path in (f"/tasks/{task_id}/cancel", f"/tasks/{task_id}/requeue", "/failed/requeue",
                 "/failed/clear"):
        code, body = get(d.url + path, b"csrf=x&confirm=yes&id=" + task_id.encode())
        assert code == 403 and "Traceback" not in body, path
    assert get(d.url + "/failed/clear")[0] == 403
    html = get(d.url + f"/tasks/{task_id}")[1]
    assert 'id="cancel"' not in html and 'id="requeue"' not in html
    assert fenv.state(task_id) == "pending"


def test_an_output_store_that_is_down_is_said_on_the_task_page_and_503_in_the_api(fenv):
    (task_id,) = fenv.push("true")
    client = create_app(data_source(fenv, lambda: Unreachable(
        "blob", OutputStoreError, "output store: connection refused (test)"))).test_client()
    resp = client.get(f"/api/task/{task_id}/output?attempt=1")
    assert resp.status_code == 503 and "connection refused" in resp.get_json()["error"]
    resp = client.get(f"/tasks/{task_id}")
    assert resp.status_code == 200
    assert b"output store unavailable" in resp.data and b"Traceback" not in resp.data
    for path in ("/", "/workers", "/failed", "/api/status"):
        assert client.get(path).status_code == 200, path

    def unconfigured():
        return None
    client = create_app(data_source(fenv, unconfigured)).test_client()
    assert client.get(f"/api/task/{task_id}/output?attempt=1").status_code == 503


def test_cancel_requeue_and_clear_with_a_login(fenv):
    pending, other, third = fenv.push("echo a", "echo b", "echo c")
    client = create_app(data_source(fenv), token=TOKEN).test_client()
    assert client_login(client) == 302
    page = client.get(f"/tasks/{pending}").get_data(as_text=True)
    assert 'id="cancel"' in page and 'id="requeue"' not in page
    resp = client.post(f"/tasks/{pending}/cancel",
                       data={"csrf": csrf_of(client), "back": f"/tasks/{pending}"})
    assert resp.status_code == 302 and resp.headers["Location"] == f"/tasks/{pending}"
    assert fenv.state(pending) == "failed"
    assert fenv.job(pending)["reason"].startswith("cancelled by alice@dashboard")
    store = control_store(fenv)
    try:
        (cancel,) = store.cancels(Q)
    finally:
        store.close()
    assert (cancel.task_id, cancel.who, cancel.grace) == (pending, "alice@dashboard", 30.0)
    page = client.get(f"/tasks/{pending}").get_data(as_text=True)
    assert "state-cancelled" in page and 'id="requeue"' in page and 'id="cancel"' not in page
    assert client.post(f"/tasks/{pending}/cancel",
                       data={"csrf": csrf_of(client)}).status_code == 409
    failed = client.get("/failed").get_data(as_text=True)
    # only a cancelled task: no "requeue the failed" button (issue 25), its own one
    assert f'data-id="{pending}"' in failed and "requeue-all" not in failed
    assert f'id="requeue-{pending}"' in failed
    assert client.post(f"/tasks/{pending}/requeue", data={"csrf": csrf_of(client)}).status_code \
        == 302
    assert fenv.state(pending) == "pending"
    store = control_store(fenv)
    try:
        assert store.cancels(Q) == [], "requeue forgets the cancel, as jobq-ctl requeue does"
    finally:
        store.close()
    assert client.post(f"/tasks/{other}/requeue", data={"csrf": csrf_of(client)}).status_code \
        == 409
    for task_id in (pending, other):
        client.post(f"/tasks/{task_id}/cancel", data={"csrf": csrf_of(client)})
    resp = client.post("/failed/requeue", data={"csrf": csrf_of(client), "id": [pending, other]})
    assert resp.status_code == 302
    assert {fenv.state(t) for t in (pending, other)} == {"pending"}
    client.post(f"/tasks/{third}/cancel", data={"csrf": csrf_of(client)})
    confirm = client.get("/failed/clear").get_data(as_text=True)
    assert "all 1 failed" in confirm and 'id="clear-confirm"' in confirm
    assert client.post("/failed/clear", data={"csrf": csrf_of(client)}).status_code == 400
    assert client.post("/failed/clear", data={"csrf": csrf_of(client), "confirm": "yes"}
                       ).status_code == 302
    assert sorted(r[0] for r in fenv.rows()) == sorted([pending, other])


def test_the_running_attempt_of_a_dead_worker_shows_as_worker_lost(fenv):
    """Attempt 1's worker has no record any more and its running record is old (SIGKILLed
    long ago); attempt 2's worker heartbeats."""
    (task_id,) = fenv.push("sleep 100")
    now = time.time()
    store = control_store(fenv)
    try:
        for attempt, who, when in ((1, "w-dead", now - 3600), (2, "w-live", now - 2)):
            store.put_result(ResultRecord(
                queue=Q, task_id=task_id, attempt=attempt, outcome="running", reason="",
                tail="", exit_status=None, worker=who, when=when, started=when,
                max_attempts=3))
        store.put_worker(WorkerRecord(id="w-live", queue=Q, host="h", pid=1, version="v",
                                      state="running", slots_used=0, slots_total=1,
                                      started=now - 10, heartbeat=now))
    finally:
        store.close()
    client = create_app(data_source(fenv)).test_client()
    api = client.get(f"/api/task/{task_id}").get_json()
    assert [(a["attempt"], a["state"]) for a in api["attempts"]] == [
        (1, "worker-lost"), (2, "running")]
    html = client.get(f"/tasks/{task_id}").get_data(as_text=True)
    row = html[html.index('data-attempt="1"'):]
    assert 'class="pill state-worker-lost">worker-lost<' in row[:row.index("</tr>")]
