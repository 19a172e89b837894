"""The dashboard over plain HTTP (no browser): the auth model, bad input, the 503 pages, the
JSON API's shapes -- a real ``jobq-ctl dashboard`` process where the wiring matters, the Flask
test client where a store must fail on cue.  Those with ``fenv`` run on SQLite and on
PostgreSQL."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time

import pytest

from supervisor.backends.base import BackendError
from supervisor.dashboard.app import create_app
from supervisor.dashboard.data import DataSource
from supervisor.fleet.control.base import ControlStoreError
from supervisor.fleet.control.records import WorkerRecord
from supervisor.fleet.control.sqlite import SqliteControlStore
from tests.dashboard.conftest import TOKEN, Unreachable, control_store, data_source
from tests.dashboard.pages import client_login, csrf_of, get

pytestmark = pytest.mark.timeout(90)
Q = "default"


def _ctl(env, *args: str, extra_code: str = "") -> subprocess.CompletedProcess:
    code = (f"import sys; {extra_code}from supervisor.ctl.main import ctl_entry; "
            f"sys.exit(ctl_entry(sys.argv[1:]))")
    return subprocess.run([sys.executable, "-c", code, "--sqlite-path", str(env.db), *args],
                          capture_output=True, text=True, timeout=60, cwd=env.tmp)


def test_read_only_dashboard_serves_pages_and_refuses_every_action(fenv, dashboard):
    fenv.push("true")
    d = dashboard()
    assert "(read-only)" in d.stderr()
    status, html = get(d.url + "/")
    assert status == 200 and 'id="count-pending">1<' in html
    assert 'data-refresh="5"' in html, "a self-hosted queue's page refreshes every 5 s"
    assert "<button" not in html.replace('<button type="submit">Find</button>', "")
    for path in ("/queue/pause", "/queue/resume", "/workers/w1/drain", "/workers/w1/stop",
                 "/login", "/logout"):
        code, body = get(d.url + path, b"csrf=x")
        assert code == 403, path
        assert "Traceback" not in body
    assert get(d.url + "/login")[0] == 403
    assert json.loads(fenv.ctl("status", "--json").stdout)["paused"] is False


def test_api_has_the_cli_json_shapes(fenv, dashboard):
    fenv.push("sleep 30")
    sup = fenv.supervisor("--worker-id", "w-api", "--heartbeat-interval", "1",
                         "--control-interval", "1")
    d = dashboard()
    from tests.conftest import wait_for
    wait_for(lambda: json.loads(get(d.url + "/api/workers")[1]) and
             json.loads(get(d.url + "/api/workers")[1])[0]["tasks"], 30, what="worker record")
    api = json.loads(get(d.url + "/api/workers")[1])
    cli = json.loads(fenv.ctl("workers", "--json").stdout)
    assert [w["id"] for w in api] == [w["id"] for w in cli] == ["w-api"]
    assert set(api[0]) == set(cli[0]) and set(api[0]["tasks"][0]) == set(cli[0]["tasks"][0])
    one = json.loads(get(d.url + "/api/worker/w-api")[1])
    assert one["id"] == "w-api" and one["slots"] == cli[0]["slots"]
    api_status = json.loads(get(d.url + "/api/status")[1])
    cli_status = json.loads(fenv.ctl("status", "--json").stdout)
    assert set(api_status) == set(cli_status)
    assert api_status["counts"] == cli_status["counts"]
    assert [r["id"] for r in api_status["running"]] == [r["id"] for r in cli_status["running"]]
    # what an operator needs on each page: the running task's command, "last seen N s ago"
    assert [r["cmd"] for r in api_status["running"]] == ["sleep 30"]
    assert 0 <= api[0]["last_seen_s"] < 60
    assert '<code class="cmd">sleep 30</code>' in get(d.url + "/")[1]
    assert re.search(r'id="worker-last-seen">\d+s ago', get(d.url + "/workers/w-api")[1])
    assert re.search(r"<td title=[^>]*>\d+s ago</td>", get(d.url + "/workers")[1])
    sup.stop()


def test_unknown_ids_are_404_and_malformed_queries_400(fenv, dashboard):
    fenv.push("true")
    d = dashboard()
    for path in ("/tasks/no-such-task", "/workers/no-such-worker", "/api/worker/nobody"):
        code, body = get(d.url + path)
        assert code == 404 and "Traceback" not in body, path
    for path in ("/workers?all=maybe", "/api/workers?all=2", "/search?id=", "/search",
                 "/search?id=%3Cscript%3E", "/tasks/%2E%2Ebad"):
        code, body = get(d.url + path)
        assert code == 400 and "Traceback" not in body, path
        assert "<script>" not in body
    code, body = get(d.url + "/api/workers?all=2")
    assert "error" in json.loads(body)


def test_search_goes_to_the_task_page(fenv, dashboard):
    (task_id,) = fenv.push("echo hello", extra=("--env", "SECRET_TOKEN=hunter2"))
    d = dashboard()
    code, html = get(d.url + f"/search?id={task_id}")
    assert code == 200 and task_id in html and "pending" in html
    assert "SECRET_TOKEN=********" in html and "hunter2" not in html


def test_a_broken_database_is_a_503_page_and_the_dashboard_keeps_serving(env, dashboard):
    env.push("true")
    d = dashboard()
    # Up, without a page that opens the queue: a request thread that opened it before the
    # file broke keeps its connection's cached pages and may still answer from them (seen
    # once in a parallel run); every thread here opens the broken file.
    assert get(d.url + "/static/style.css")[0] == 200
    env.db.write_bytes(b"this is not a database" * 100)
    for suffix in ("-wal", "-shm"):
        (env.tmp / f"jobq.db{suffix}").unlink(missing_ok=True)
    code, body = get(d.url + "/")
    assert code == 503 and "queue is unavailable" in body and "Traceback" not in body
    assert get(d.url + "/api/status")[0] == 503
    assert get(d.url + "/static/style.css")[0] == 200
    code, body = get(d.url + "/tasks/abc")
    assert code == 503 and "Traceback" not in body


def test_a_control_store_that_errors_is_503_for_its_pages_only(env):
    env.push("true")
    from supervisor.backends.sqlite.backend import SqliteBackend

    data = DataSource(Q, lambda: SqliteBackend(str(env.db), Q, "dash"), lambda: Unreachable(
        "sqlite", ControlStoreError, "control store: connection refused (test)"))
    client = create_app(data, token=TOKEN).test_client()
    for path in ("/workers", "/workers/w1", "/api/workers"):
        resp = client.get(path)
        assert resp.status_code == 503, path
        assert b"connection refused" in resp.data and b"Traceback" not in resp.data
    resp = client.get("/")
    assert resp.status_code == 200 and b"control store unavailable" in resp.data
    assert client.get("/api/status").get_json()["paused"] is None


def test_a_backend_that_errors_is_503(env):
    def broken():
        raise BackendError("queue: database is locked (test)")

    data = DataSource(Q, broken, lambda: SqliteControlStore(str(env.db)))
    client = create_app(data).test_client()
    resp = client.get("/")
    assert resp.status_code == 503 and b"database is locked" in resp.data
    assert client.get("/workers").status_code == 200


def test_a_failed_call_closes_the_threads_clients_and_the_next_request_reopens(env):
    env.push("true")
    from supervisor.backends.sqlite.backend import SqliteBackend

    opened: list[SqliteBackend] = []
    fail = [True]

    class Flaky(SqliteBackend):
        def status(self):
            if fail[0]:
                fail[0] = False
                raise BackendError("queue: connection reset (test)")
            return super().status()

    def open_backend():
        opened.append(Flaky(str(env.db), Q, "dash"))
        return opened[-1]

    data = DataSource(Q, open_backend, lambda: SqliteControlStore(str(env.db)))
    client = create_app(data).test_client()
    assert client.get("/api/status").status_code == 503
    assert client.get("/api/status").get_json()["counts"]["pending"] == 1
    assert len(opened) == 2, "the failed client was dropped and a new one opened"


def test_actions_need_a_login_and_the_csrf_token(fenv):
    fenv.push("true")
    client = create_app(data_source(fenv), token=TOKEN).test_client()
    assert b'id="pause"' not in client.get("/").data, "no button before the login"
    resp = client.post("/queue/pause", data={"csrf": csrf_of(client, "/login")})
    assert resp.status_code == 403 and b"log in first" in resp.data
    assert client_login(client, token="wrong-token-wrong-token") == 403
    assert client_login(client) == 302
    page = client.get("/").get_data(as_text=True)
    assert 'id="pause"' in page
    csrf_fields = re.findall(r'name="csrf" value="([^"]*)"', page)
    assert len(csrf_fields) >= 2 and set(csrf_fields) == {csrf_of(client)}, "every form has it"
    assert client.post("/queue/pause").status_code == 403, "no CSRF token"
    assert client.post("/queue/pause", data={"csrf": "forged"}).status_code == 403
    assert json.loads(fenv.ctl("status", "--json").stdout)["paused"] is False
    t0 = time.time()
    assert client.post("/queue/pause", data={"csrf": csrf_of(client)}).status_code == 302
    store = control_store(fenv)
    try:
        flag = store.poll(Q, "test", None).flag
    finally:
        store.close()
    assert flag is not None and flag.paused and flag.who == "alice@dashboard"
    assert flag.when >= t0 - 1
    resp = client.post("/workers/nobody/drain", data={"csrf": csrf_of(client)})
    assert resp.status_code == 404
    now = time.time()
    store = control_store(fenv)
    try:
        store.put_worker(WorkerRecord(id="w-live", queue=Q, host="h", pid=1, version="0",
                                      state="running", slots_used=0, slots_total=1,
                                      started=now, heartbeat=now))
        resp = client.post("/workers/w-live/stop", data={"csrf": csrf_of(client),
                                                         "back": "//evil.example/"})
        assert resp.status_code == 302 and resp.headers["Location"] == "/", "no open redirect"
        (cmd,) = store.poll(Q, "w-live", None).commands
    finally:
        store.close()
    assert (cmd.action, cmd.worker, cmd.who) == ("stop", "w-live", "alice@dashboard")
    assert client.post("/workers/w-live/reboot", data={"csrf": csrf_of(client)}).status_code \
        == 404
    # Every action done is kept in the control store, newest first; refused ones are not.
    actions = client.get("/api/actions").get_json()
    assert [(a["who"], a["action"], a["detail"]) for a in actions] == [
        ("alice@dashboard", "stop", "w-live"), ("alice@dashboard", "pause", "")]
    page = client.get("/actions").get_data(as_text=True)
    assert page.count('class="audit"') == 2 and "w-live" in page


def test_non_loopback_bind_without_a_token_exits_2_with_one_line(env):
    res = _ctl(env, "dashboard", "--bind", "0.0.0.0:0")
    assert res.returncode == 2
    assert len(res.stderr.strip().splitlines()) == 1 and "--token-file" in res.stderr
    res = _ctl(env, "dashboard", "--bind", "nonsense")
    assert res.returncode == 2 and "HOST:PORT" in res.stderr
    res = _ctl(env, "dashboard", "--token-file", str(env.tmp / "missing"))
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1


def test_without_flask_the_command_says_what_to_install(env):
    res = _ctl(env, "dashboard", extra_code="sys.modules['flask'] = None; ")
    assert res.returncode == 2
    assert res.stderr.strip().splitlines() == [
        "jobq-ctl: error: dashboard: Flask and waitress are not installed: "
        "pip install 'jobq-supervisor[dashboard]'"]


def test_sigterm_stops_the_dashboard(env, dashboard):
    d = dashboard()
    d.proc.terminate()
    assert d.proc.wait(15) == 0
