"""The audit log of operator actions (issue 30, point 6): jobq-ctl's actions are kept beside
the dashboard's, listed by ``jobq-ctl actions`` and the dashboard's Actions page; a control
store that is down never fails the action.  Real jobq-ctl processes (few: each costs CPU),
the Flask test client for the dashboard; ``fenv`` runs on SQLite and PostgreSQL."""

from __future__ import annotations

import json

import pytest

from supervisor.backends import open_backend
from supervisor.core.signing import load_key
from supervisor.dashboard.app import create_app
from supervisor.fleet.control.open import open_control_store
from supervisor.ops.audit import tasks_text
from supervisor.ops.fleet import who
from tests.azurite import free_port, table_connection_string
from tests.dashboard.conftest import TOKEN, data_source
from tests.dashboard.pages import client_login, csrf_of

pytestmark = pytest.mark.timeout(90)


def _shown(rows: list[dict]) -> list[tuple[str, str, str, str]]:
    return [(r["who"], r["via"], r["action"], r["detail"]) for r in rows]


def test_jobq_ctl_actions_are_kept_and_listed_beside_the_dashboards(fenv):
    key_file = fenv.tmp / "operator.key"
    key_file.write_text("operator-secret\n")
    kid = load_key(str(key_file)).kid
    failed, untouched, cancelled = fenv.push("false", "true", "true")
    backend = open_backend(fenv.settings(worker_id="test-worker"))
    try:  # a failed task to requeue, as a worker fails it
        [lease] = backend.receive(1, 60.0)
        assert lease.message_id == failed
        lease.dead_letter("exit 1", "", 1)
    finally:
        backend.close()
    fenv.ctl("cancel", cancelled, "--reason", "wrong input")
    fenv.ctl("--signing-key-file", str(key_file), "pause")
    fenv.ctl("requeue", failed)
    client = create_app(data_source(fenv), token=TOKEN).test_client()
    assert client_login(client) == 302
    assert client.post("/queue/resume", data={"csrf": csrf_of(client)}).status_code == 302
    me = who()
    expected = [("alice@dashboard", "dashboard", "resume", ""),
                (me, "jobq-ctl", "requeue", failed),
                (me, "jobq-ctl", "pause", ""),
                (me, "jobq-ctl", "cancel", f"{cancelled} (reason: wrong input)")]
    served = client.get("/api/actions").get_json()
    assert _shown(served) == expected
    printed = json.loads(fenv.ctl("--signing-key-file", str(key_file), "actions",
                                  "--json").stdout)
    assert _shown(printed) == expected
    assert [r["signature"] for r in printed] == [None, None, f"key {kid}: valid", None]
    assert all(r["when"] and r["when"].endswith("Z") for r in printed)
    page = client.get("/actions").get_data(as_text=True)
    assert page.count('class="audit"') == 4 and "jobq-ctl" in page and me in page
    assert untouched not in json.dumps(printed), "only what was acted on is named"


def test_a_control_store_that_is_down_does_not_fail_the_action(env):
    """SQLite queue, control store on a table endpoint nobody listens on: clear is done, exit
    0, one warning line; with --control off nothing is recorded and nothing more said."""
    env.push("true", "true")
    down = table_connection_string(free_port())
    res = env.ctl("--control-connection-string", down, "clear")
    assert res.stdout.strip() == "deleted 2"
    warning = res.stderr.strip().splitlines()
    assert len(warning) == 1 and "not kept in the audit log" in warning[0], res.stderr
    env.push("true")
    res = env.ctl("--control", "off", "clear")
    assert (res.stdout.strip(), res.stderr) == ("deleted 1", "")
    store = open_control_store(env.settings())
    try:
        assert store is not None and store.audits("default") == []
    finally:
        store.close()


def test_a_long_id_list_is_cut_to_one_readable_line():
    ids = [f"{i:032x}" for i in range(25)]
    text = tasks_text(ids, 24, "selected tasks")
    assert text.startswith("24 of 25 selected tasks: ")
    assert text.endswith(f"{ids[19]} and 5 more") and ids[20] not in text
    assert tasks_text(ids[:1]) == ids[0]
