"""The dashboard as the read-only operator role of docs/backends.rst ("Roles"), made for real
on the test's PostgreSQL database: every page serves, and every action (pause, resume, drain,
cancel, requeue, clear) is refused with one clear line -- a 403 page, no traceback, nothing
changed."""

from __future__ import annotations

import json
import time

import pytest

from supervisor.dashboard.app import create_app
from supervisor.fleet.control.records import WorkerRecord
from tests.dashboard.conftest import TOKEN, control_store, data_source
from tests.dashboard.pages import client_login, csrf_of, get
from tests.postgres.env import PgEnv
from tests.postgres.test_roles import apply_documented_grants, role_url, roles  # noqa: F401

pytestmark = [pytest.mark.postgres, pytest.mark.timeout(90)]


def test_the_read_only_role_serves_every_page_and_is_refused_every_action(
        pg, pg_server, pg_url, roles, dashboard, tmp_path):  # noqa: F811
    apply_documented_grants(pg_server, pg_url, roles)
    pg.serve()
    pending, failed = pg.push("echo a", "echo b")
    with pg.lease_of(failed) as lease:
        lease.dead_letter("exit status 3", "boom")
    reader = PgEnv(tmp_path, role_url(pg_url, roles, "jobq_reader", "reader-secret"))
    d = dashboard(environ=reader.secret_env())  # jobq-ctl dashboard as the reader
    for path in ("/", "/workers", "/failed", "/actions", f"/tasks/{pending}",
                 f"/tasks/{failed}", f"/api/task/{pending}/output?attempt=1"):
        code, body = get(d.url + path)
        assert code == 200 and "Traceback" not in body, (path, body)
    assert json.loads(get(d.url + "/api/status")[1])["counts"]["pending"] == 1

    now = time.time()
    store = control_store(pg)
    try:  # a live worker to drain
        store.put_worker(WorkerRecord(id="w-x", queue="default", host="h", pid=1, version="0",
                                      state="running", slots_used=0, slots_total=1,
                                      started=now, heartbeat=now))
    finally:
        store.close()
    client = create_app(data_source(reader), token=TOKEN).test_client()
    assert client_login(client) == 302
    for path, form, what in (
            ("/queue/pause", {}, "control store"), ("/queue/resume", {}, "control store"),
            ("/workers/w-x/drain", {}, "control store"),
            (f"/tasks/{pending}/cancel", {}, "control store"),
            (f"/tasks/{failed}/requeue", {}, "queue"),
            ("/failed/requeue", {"id": failed}, "queue"),
            ("/failed/clear", {"confirm": "yes"}, "queue")):
        resp = client.post(path, data={"csrf": csrf_of(client), **form})
        text = resp.get_data(as_text=True)
        assert resp.status_code == 403 and "Traceback" not in text, (path, text)
        assert f"The {what} refused it: " in text and "permission denied" in text, path
        assert "may only read" in text and "reader-secret" not in text, path
    assert [r[1] for r in pg.rows()] == ["pending", "failed"], "nothing changed"
    assert json.loads(pg.ctl("status", "--json").stdout)["paused"] is False
    store = control_store(pg)
    try:
        assert store.cancels("default") == [] and store.audits("default", 10) == []
        assert store.poll("default", "w-x", None).commands == ()
    finally:
        store.close()
