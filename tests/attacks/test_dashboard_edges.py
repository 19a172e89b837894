"""Issue 39 §5, replayed: the dashboard's edges and log forging.  A DNS-rebinding Host header
(a real waitress server on loopback, and a real ``jobq-ctl dashboard``), a flood of wrong
tokens and then the right one, a tab-prefixed ``back=`` after an action (Flask's test
client), and a refused message whose id writes a fake log line (a real worker on SQLite);
U+202E in a task id on the tasks page."""

from __future__ import annotations

import http.client
import re

import pytest

from supervisor.backends.sqlite.backend import SqliteBackend
from supervisor.core.settings import EXIT_TASKS_FAILED
from supervisor.core.task import Task
from supervisor.dashboard.app import create_app
from supervisor.dashboard.data import DataSource
from supervisor.dashboard.edges import OVERALL, PER_CLIENT, WINDOW, HostCheck
from supervisor.fleet.control.sqlite import SqliteControlStore
from tests.dashboard.conftest import TOKEN, dashboard, served  # noqa: F401 (fixtures)
from tests.dashboard.pages import client_login, csrf_of

pytestmark = pytest.mark.timeout(120)
Q = "default"


def _source(env) -> DataSource:
    return DataSource(Q, lambda: SqliteBackend(str(env.db), Q, "dash"),
                      lambda: SqliteControlStore(str(env.db)))


def _get(base: str, path: str, host: str) -> tuple[int, str]:
    """GET ``path`` from the server at ``base`` with a Host header of our choosing, as a
    rebinding page's request carries the attacker's name."""
    address = base.removeprefix("http://")
    conn = http.client.HTTPConnection(address, timeout=30)
    try:
        conn.request("GET", path, headers={"Host": host})
        resp = conn.getresponse()
        return resp.status, resp.read().decode()
    finally:
        conn.close()


PAGES = ("/", "/api/status", "/api/workers", "/tasks", "/failed", "/actions",
         "/static/app.js", "/no-such-page")


def test_a_rebinding_host_reads_no_page_through_loopback(env, served):  # noqa: F811
    env.push("echo secret-looking-command")
    url = served(create_app(_source(env)))  # bound to 127.0.0.1, as by default
    port = url.rpartition(":")[2]
    for path in PAGES:
        status, body = _get(url, path, f"rebind.evil.example:{port}")
        assert status == 400, (path, status)
        assert "secret-looking-command" not in body and "does not answer" in body, path
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", "LOCALHOST.", f"[::1]:{port}"):
        assert _get(url, "/tasks", host)[0] == 200, host
    assert "secret-looking-command" in _get(url, "/tasks", f"127.0.0.1:{port}")[1]


def test_allowed_hosts_add_a_proxy_name_and_nothing_else(env, served):  # noqa: F811
    url = served(create_app(_source(env),
                            hosts=HostCheck("127.0.0.1", ["jobq.example.com"])))
    assert _get(url, "/", "jobq.example.com")[0] == 200
    assert _get(url, "/", "JOBQ.example.com:443")[0] == 200
    for host in ("jobq.example.com.evil.example", "evil.example", "example.com", "10.1.2.3",
                 ""):
        assert _get(url, "/", host)[0] == 400, host


def test_the_real_dashboard_refuses_a_rebinding_host(env, dashboard):  # noqa: F811
    env.push("true")
    d = dashboard("--allowed-hosts", "jobq.example.com")
    port = d.url.rpartition(":")[2]
    assert _get(d.url, "/api/status", f"rebind.evil.example:{port}")[0] == 400
    assert _get(d.url, "/api/status", "jobq.example.com")[0] == 200
    assert _get(d.url, "/api/status", f"127.0.0.1:{port}")[0] == 200


def test_a_login_flood_is_throttled_and_the_right_token_waits(env):
    now = [1000.0]
    client = create_app(_source(env), token=TOKEN, clock=lambda: now[0]).test_client()
    codes = [client_login(client, token=f"wrong-token-number-{i:04d}") for i in range(300)]
    assert codes[:PER_CLIENT] == [403] * PER_CLIENT
    assert set(codes[PER_CLIENT:]) == {429}, "refused without comparing the token"
    page = client.get("/login").get_data(as_text=True)
    csrf = re.search(r'name="csrf" value="([^"]+)"', page).group(1)
    resp = client.post("/login", data={"csrf": csrf, "token": TOKEN, "name": "alice"})
    assert resp.status_code == 429 and "too many failed logins" in resp.get_data(as_text=True)
    assert 1 <= int(resp.headers["Retry-After"]) <= WINDOW
    assert b'id="pause"' not in client.get("/").data, "the right token did not log in"
    now[0] += WINDOW
    assert client_login(client) == 302
    assert b'id="pause"' in client.get("/").data


def test_a_flood_from_many_addresses_meets_the_overall_bound(env):
    now = [1000.0]
    app = create_app(_source(env), token=TOKEN, clock=lambda: now[0])
    codes = []
    for i in range(OVERALL * 2):
        client = app.test_client()
        client.environ_base["REMOTE_ADDR"] = f"10.0.{i // 250}.{i % 250}"
        codes.append(client_login(client, token="wrong-token-wrong-token"))
    assert codes.count(403) == OVERALL and codes[OVERALL:] == [429] * OVERALL


BAD_BACKS = ["/\t/evil.example/", "/\n/evil.example/", "/\r\n/evil.example", "//evil.example",
             "/\\evil.example", "\\/evil.example", " //evil.example", "/\x00/evil.example",
             "https://evil.example/", "javascript:alert(1)", "/\u202e/evil.example",
             "evil.example", "/\x1b//evil.example"]


def test_an_action_sends_the_browser_to_no_other_site(env):
    env.push("true")
    client = create_app(_source(env), token=TOKEN).test_client()
    assert client_login(client) == 302
    for back in BAD_BACKS:
        resp = client.post("/queue/pause", data={"csrf": csrf_of(client), "back": back})
        assert resp.status_code == 302 and resp.headers["Location"] == "/", repr(back)
    for back in ("/tasks?state=failed&worker=w-1", "/failed", "/workers/w-1"):
        resp = client.post("/queue/resume", data={"csrf": csrf_of(client), "back": back})
        assert resp.headers["Location"] == back


FORGED = "x\n2030-01-01 00:00:00,000 ERROR   [admin] forged line\x1b[2K\u202eevil"


def test_a_refused_message_id_writes_no_line_of_its_own(env):
    SqliteBackend(str(env.db), Q, "producer").push([Task(cmd="rm -rf /tmp/nothing",
                                                         id=FORGED)])
    sup = env.supervisor("--exit-when-empty", "--allowed-commands", r"echo [a-z]+")
    assert sup.wait(60) == EXIT_TASKS_FAILED  # the refused one
    log = sup.log()
    assert "command not allowed" in log
    assert "\x1b" not in log and "\u202e" not in log, "no raw ESC nor bidi override"
    assert not any(line.startswith("2030-01-01") for line in log.splitlines()), log
    assert "[x\\n2030-01-01 00:00:00,000 ERROR   [admin] forged line\\x1b[2K\\u202eevil]" \
        in log


def test_a_json_log_escapes_them_too(env):
    SqliteBackend(str(env.db), Q, "producer").push([Task(cmd="rm -rf /tmp/nothing",
                                                         id=FORGED)])
    sup = env.supervisor("--exit-when-empty", "--allowed-commands", r"echo [a-z]+",
                         "--log-format", "json")
    assert sup.wait(60) == EXIT_TASKS_FAILED  # the refused one
    log = sup.log()
    assert "command not allowed" in log and "\x1b" not in log and "\u202e" not in log
    assert not any(line.startswith("2030") for line in log.splitlines())


def test_a_bidi_override_in_an_id_shows_escaped_on_the_pages(env):
    SqliteBackend(str(env.db), Q, "producer").push([Task(cmd="echo \u202eabc", id="t\u202e1")])
    client = create_app(_source(env)).test_client()
    for path in ("/tasks", "/api/status"):
        body = client.get(path).get_data(as_text=True)
        assert "\u202e" not in body, path
    page = client.get("/tasks").get_data(as_text=True)
    assert "t\\u202e1" in page and "echo \\u202eabc" in page
