"""The dashboard serving several queues (``--queue high,low``) over plain HTTP: the overview's
row per queue, ``?queue=`` on every other page (none: the first queue), the task search over
every queue, /api/status in the shape of ``jobq-ctl status --queue a,b --json``, and pause on
one queue only (Flask test client, real SQLite stores); the first test on PostgreSQL too
(``fenv``)."""

from __future__ import annotations

import json
import re

import pytest

from supervisor.backends.sqlite.backend import SqliteBackend
from supervisor.dashboard.app import create_app
from supervisor.dashboard.data import DataSource
from supervisor.dashboard.history import History
from supervisor.fleet.control.sqlite import SqliteControlStore
from tests.dashboard.conftest import TOKEN
from tests.dashboard.pages import csrf_of, get

pytestmark = pytest.mark.timeout(90)


def _push(env, queue: str, *cmds: str) -> list[str]:
    return env.push(*cmds, extra=("--queue", queue))


def test_every_queue_on_the_overview_and_one_queue_per_page(fenv, dashboard):
    high = _push(fenv, "high", "true", "true")
    (low,) = _push(fenv, "low", "echo low")
    d = dashboard("--queue", "high,low")
    code, html = get(d.url + "/")
    assert code == 200
    assert 'id="count-pending-high">2<' in html and 'id="count-pending-low">1<' in html
    assert 'id="queue-switcher"' in html and 'id="depth-high"' in html
    assert 'id="depth-low"' in html

    # the JSON API: the CLI's per-queue object
    api = json.loads(get(d.url + "/api/status")[1])
    cli = json.loads(fenv.ctl("status", "--queue", "high,low", "--json").stdout)
    assert set(api) == set(cli) == {"high", "low"}
    assert {q: api[q]["counts"] for q in api} == {q: cli[q]["counts"] for q in cli}
    assert set(api["low"]) == set(cli["low"])

    # old URLs are the first queue's; ?queue= picks another, and the links carry it
    code, html = get(d.url + "/failed")
    assert code == 200 and 'href="/failed?queue=low"' in html  # the switcher
    code, html = get(d.url + "/workers?queue=low")
    assert code == 200 and 'href="/failed?queue=low"' in html and 'class="current"' in html
    assert 'name="queue" value="low"' in html, "the search form keeps the page's queue"
    assert get(d.url + f"/tasks/{high[0]}")[0] == 200
    assert get(d.url + f"/tasks/{low}")[0] == 404, "the first queue does not have it"
    code, html = get(d.url + f"/tasks/{low}?queue=low")
    assert code == 200 and "echo low" in html
    code, body = get(d.url + "/workers?queue=nope")
    assert code == 404 and "not served" in body
    assert get(d.url + "/api/workers?queue=nope")[0] == 404

    # the search finds a task in any queue and goes to its queue's page
    code, html = get(d.url + f"/search?id={low}")
    assert code == 200 and "echo low" in html
    code, html = get(d.url + f"/search?id={high[1]}&queue=low")
    assert code == 200 and high[1] in html and "pending" in html
    assert get(d.url + "/search?id=nothing-here")[0] == 404


def test_one_queue_keeps_its_api_shape(env, dashboard):
    env.push("true")
    d = dashboard()
    api = json.loads(get(d.url + "/api/status")[1])
    assert "counts" in api and api["counts"]["pending"] == 1
    assert 'id="queue-switcher"' not in get(d.url + "/")[1]


def _source(env, name: str) -> DataSource:
    return DataSource(name, lambda: SqliteBackend(str(env.db), name, "dash"),
                      lambda: SqliteControlStore(str(env.db)))


def test_pause_applies_to_its_own_queue_and_a_down_queue_is_one_row(env):
    _push(env, "high", "true")
    _push(env, "low", "true")
    sources = [_source(env, "high"), _source(env, "low"),
               DataSource("gone", lambda: SqliteBackend(str(env.tmp / "no" / "x.db"), "gone",
                                                        "dash"),
                          lambda: SqliteControlStore(str(env.db)))]
    client = create_app(sources, {s.queue: History() for s in sources},
                        token=TOKEN).test_client()
    page = client.get("/login").get_data(as_text=True)
    csrf = re.search(r'name="csrf" value="([^"]+)"', page).group(1)
    assert client.post("/login", data={"csrf": csrf, "token": TOKEN,
                                       "name": "bob"}).status_code == 302
    page = client.get("/").get_data(as_text=True)
    assert 'id="pause-high"' in page and 'id="pause-low"' in page
    assert 'id="queue-error-gone"' in page, "a queue that is down is its row, not a 503"
    resp = client.post("/queue/pause?queue=low", data={"csrf": csrf_of(client)})
    assert resp.status_code == 302
    store = SqliteControlStore(str(env.db))
    try:
        low, high = store.poll("low", "t", None).flag, store.poll("high", "t", None).flag
    finally:
        store.close()
    assert low is not None and low.paused and low.who == "bob@dashboard"
    assert high is None or not high.paused
    page = client.get("/").get_data(as_text=True)
    assert 'id="resume-low"' in page and 'id="pause-high"' in page
    status = client.get("/api/status").get_json()
    assert status["low"]["paused"] is True and status["high"]["paused"] is False
    assert status["gone"] is None
    actions = client.get("/api/actions?queue=low").get_json()
    assert [(a["who"], a["action"]) for a in actions] == [("bob@dashboard", "pause")]
    assert client.get("/api/actions").get_json() == [], "the audit is the queue's"


def test_the_queues_come_from_the_workers_ini_too(env, dashboard):
    _push(env, "high", "true")
    _push(env, "low", "true", "true")
    ini = env.tmp / "worker.ini"
    ini.write_text(f"[jobq-supervisor]\nsqlite-path = {env.db}\nqueue = high,low\n")
    d = dashboard(base=["--config", str(ini)])
    code, html = get(d.url + "/")
    assert code == 200
    assert 'id="count-pending-high">1<' in html and 'id="count-pending-low">2<' in html
