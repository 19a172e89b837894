"""The dashboard in a real headless Chromium against Azurite: a Storage Queue worker whose
control store is Azure Table Storage and whose output store is Azure Blob Storage (one
control connection string with TableEndpoint= and BlobEndpoint=).  The overview shows the
running worker, the task page the task's output growing from the blob store."""

from __future__ import annotations

import pytest

from tests.azurite import ACCOUNT, ACCOUNT_KEY
from tests.conftest import wait_for
from tests.dashboard.conftest import shoot
from tests.dashboard.pages import reload_until, text_of

pytestmark = [pytest.mark.azure, pytest.mark.timeout(150)]
FAST = ("--control-interval", "1", "--heartbeat-interval", "1", "--poll-interval", "0.2")


def test_overview_and_live_output_on_storage_queue_table_and_blob(
        sq, azurite_table, azurite_blob, dashboard, browser):
    control = {"JOBQ_CONTROL_CONNECTION_STRING": (
        f"DefaultEndpointsProtocol=http;AccountName={ACCOUNT};AccountKey={ACCOUNT_KEY};"
        f"TableEndpoint=http://127.0.0.1:{azurite_table}/{ACCOUNT};"
        f"BlobEndpoint=http://127.0.0.1:{azurite_blob}/{ACCOUNT}")}
    release = sq.tmp / "release"
    (task_id,) = sq.ctl("push", "-c", f"i=0; while [ ! -e {release} ]; do echo az-line-$i; "
                        f"i=$((i+1)); sleep 0.2; done").stdout.split()
    sup = sq.supervisor("--worker-id", "w-az", *FAST, env=control)
    try:
        _check(sq, task_id, dashboard, browser, control)
    finally:
        release.touch()
    sup.stop()


def _check(sq, task_id: str, dashboard, browser, control: dict[str, str]) -> None:
    d = dashboard(base=sq.base_args(), environ={**sq.secret_env(), **control})
    browser.get(d.url + "/")
    reload_until(browser, lambda b: "running: 1" in text_of(b, "worker-states")
                  and "w-az" in text_of(b, "running"), 40,
                  what="the Azure worker and its task on the overview")
    assert text_of(browser, "count-pending").endswith("queued"), "Storage Queue counts"
    # issue 26: the depth chart draws Storage Queue's own count under its word, not a flat
    # 0 "pending"
    reload_until(browser, lambda b: b.find_elements("css selector", ".chart line.dot.queued"),
                  30, what="the sampler's queued line")
    assert browser.find_element("css selector", "#depth figcaption").text.split() == ["queued"]
    assert not browser.find_elements("css selector", ".chart polyline.pending")
    shoot(browser, "overview-azure")
    browser.get(d.url + f"/tasks/{task_id}")
    browser.execute_script("window.__same_page = 1")

    def lines() -> int:
        return text_of(browser, "output").count("az-line-")
    wait_for(lambda: lines() >= 3, 40, what="output from the blob store")
    seen = lines()
    wait_for(lambda: lines() >= seen + 5, 40, what="new lines without a reload")
    assert browser.execute_script("return window.__same_page") == 1
    assert "w-az" in text_of(browser, "attempts")
    shoot(browser, "task-azure")
    # issue 30 (1): the tasks page lists the running task from its worker's record, and says
    # what a queue without an index of its tasks can show
    browser.get(d.url + "/tasks?state=running")
    assert [e.get_attribute("data-id") for e in browser.find_elements(
        "css selector", "#tasks tbody tr")] == [task_id]
    assert "first 32 messages" in text_of(browser, "tasks-note")
    browser.get(d.url + f"/tasks/{task_id}")
    (sq.tmp / "release").touch()
    wait_for(lambda: text_of(browser, "output-status") == "complete", 40,
             what="the attempt's output complete")
