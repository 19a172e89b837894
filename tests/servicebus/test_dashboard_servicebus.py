"""Issue 30 (1) on Service Bus (the project's AMQP test broker; the control store in Azurite's
table service) in a real headless Chromium: the tasks page lists a running task from its
worker's record and a waiting one from a peek, once each, and says what a queue without an
index of its tasks can show."""

from __future__ import annotations

import json

import pytest

from tests.azurite import table_connection_string
from tests.conftest import wait_for
from tests.dashboard.conftest import browser, dashboard  # noqa: F401 (fixtures used here)
from tests.dashboard.pages import reload_until, text_of

pytestmark = [pytest.mark.servicebus, pytest.mark.timeout(150)]
FAST = ("--control-interval", "1", "--heartbeat-interval", "1", "-n", "1")


@pytest.fixture(autouse=True)
def own_queue(sb_env) -> None:
    """A queue name of the test's own: the control store (azurite_table) is the session's,
    and the records another test left for the same name (its results, its workers) showed
    here (a succeeded task of another test on the tasks page, found in a CI run)."""
    sb_env.queue = f"q-{sb_env.token[:12]}"


def test_tasks_page_on_servicebus(sb_env, azurite_table, dashboard, browser):  # noqa: F811
    control = {"JOBQ_CONTROL_CONNECTION_STRING": table_connection_string(azurite_table)}
    release = sb_env.tmp / "release"
    (running,) = sb_env.push(f"while [ ! -e {release} ]; do sleep 0.1; done")
    sup = sb_env.supervisor("--worker-id", "w-sb", *FAST, env=control)
    try:
        def runs() -> bool:
            status = json.loads(sb_env.ctl("status", "--json", env=control).stdout)
            return [r["id"] for r in status["running"]] == [running]
        wait_for(runs, 40, what="the task running in its worker's record")
        (waiting,) = sb_env.push("echo waiting")
        d = dashboard(base=["--backend", "servicebus", "--queue", sb_env.queue],
                      environ={"JOBQ_CONNECTION_STRING": sb_env.connection_string, **control})

        seen: list[dict[str, str]] = [{}]

        def rows(b) -> dict[str, str]:
            seen[0] = {r.get_attribute("data-id"): r.find_element("css selector", ".pill").text
                       for r in b.find_elements("css selector", "#tasks tbody tr")}
            return seen[0]
        browser.get(d.url + "/tasks")
        try:
            reload_until(browser, lambda b: rows(b) == {running: "running", waiting: "pending"},
                         30, what="the running task once, from its record; the waiting one "
                                  "peeked")
        except AssertionError as exc:
            raise AssertionError(f"{exc}; the page showed {seen[0]} (running {running}, "
                                 f"waiting {waiting})\n{sup.log()[-3000:]}") from None
        assert "first 32 messages" in text_of(browser, "tasks-note")
    finally:
        release.touch()
    sup.stop()
