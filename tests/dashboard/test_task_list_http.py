"""Issue 30 (1): the dashboard's tasks page over HTTP (Flask's test client) on SQLite and
PostgreSQL: filters, keyset pages, the JSON API, and bulk cancel / requeue behind a
confirmation step (CSRF and login as every action)."""

from __future__ import annotations

import re

import pytest

from supervisor.dashboard.app import create_app
from tests.dashboard.conftest import TOKEN, data_source
from tests.dashboard.pages import client_login, csrf_of

pytestmark = pytest.mark.timeout(90)


def _shown(html: str) -> list[str]:
    return re.findall(r'<tr data-id="([0-9a-f]+)">', html)


def test_tasks_page_filters_and_pages(fenv):
    # one push each: the tasks of one push share their push time on PostgreSQL (now() of its
    # transaction) and list among themselves in id order
    ids = [fenv.push(cmd)[0] for cmd in ("echo alpha", "echo beta", "exit 3", "echo gamma")]
    client = create_app(data_source(fenv)).test_client()
    html = client.get("/tasks").get_data(as_text=True)
    assert _shown(html) == ids[::-1], "newest first"
    assert 'id="bulk-cancel"' not in html, "read-only: no buttons"
    assert _shown(client.get("/tasks?q=beta").get_data(as_text=True)) == [ids[1]]
    assert _shown(client.get("/tasks?state=running").get_data(as_text=True)) == []
    first = client.get("/tasks?limit=3").get_data(as_text=True)
    assert _shown(first) == ids[:0:-1]
    link = re.search(r'href="([^"]+)" id="next-page"', first).group(1).replace("&amp;", "&")
    assert _shown(client.get(link).get_data(as_text=True)) == [ids[0]]
    api = client.get("/api/tasks?state=pending&limit=2").get_json()
    assert [t["id"] for t in api["tasks"]] == ids[:1:-1] and api["next"] is not None
    assert api["tasks"][0]["cmd"] == "echo gamma" and api["note"] is None
    for bad in ("state=done", "limit=0", "worker=%20bad%20id", "limit=x", "after=nope"):
        assert client.get(f"/tasks?{bad}").status_code == 400, bad


def test_bulk_cancel_and_requeue_confirm_first(fenv):
    ids = fenv.push("echo one", "echo two", "echo three")
    client = create_app(data_source(fenv), token=TOKEN).test_client()
    assert client.post("/tasks/bulk", data={"action": "cancel", "id": ids}).status_code \
        in (400, 403), "no CSRF token, no login"
    assert client_login(client) == 302
    page = client.get("/tasks").get_data(as_text=True)
    assert 'id="bulk-cancel"' in page and page.count('type="checkbox" name="id"') == 3
    csrf = csrf_of(client, "/tasks")
    ask = client.post("/tasks/bulk", data={"csrf": csrf, "action": "cancel", "id": ids[:2],
                                           "back": "/tasks"})
    assert ask.status_code == 200 and "Cancel 2 tasks?" in ask.get_data(as_text=True)
    assert {fenv.state(i) for i in ids} == {"pending"}, "nothing happens before confirming"
    done = client.post("/tasks/bulk", data={"csrf": csrf, "action": "cancel", "id": ids[:2],
                                            "confirm": "yes", "back": "/tasks"})
    assert done.status_code == 302 and done.headers["Location"] == "/tasks"
    assert [fenv.state(i) for i in ids] == ["failed", "failed", "pending"]
    cancelled = client.get("/tasks?state=cancelled").get_data(as_text=True)
    assert sorted(_shown(cancelled)) == sorted(ids[:2])
    back = client.post("/tasks/bulk", data={"csrf": csrf, "action": "requeue", "id": ids,
                                            "confirm": "yes"})
    assert back.status_code == 302 and {fenv.state(i) for i in ids} == {"pending"}
    actions = client.get("/api/actions").get_json()
    assert [a["action"] for a in actions][:2] == ["requeue", "cancel"]
    assert "2 of 2 selected tasks" in actions[1]["detail"]
    assert client.post("/tasks/bulk", data={"csrf": csrf, "action": "delete", "id": ids}
                       ).status_code == 400
    assert client.post("/tasks/bulk", data={"csrf": csrf, "action": "cancel"}
                       ).status_code == 400
