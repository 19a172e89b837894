"""The task and failed pages in a real headless Chromium (Selenium) with two real workers, on
SQLite and on PostgreSQL (``fenv``): a running task's output grows on the open page without a
reload (and is shown as text, never as HTML), the cancel button cancels it, the requeue
button on the failed page brings a failed task back and it runs again; the tasks page
filters by state and cancels the selected tasks after a confirmation; screenshots of the pages
at 1280x800 and 390x844 (no sideways scroll on the phone)."""

from __future__ import annotations

import pytest

from tests.conftest import wait_for
from tests.dashboard.conftest import login, shoot
from tests.dashboard.pages import BROWSER_FAST, click, reload_until, text_of

pytestmark = pytest.mark.timeout(150)


def _lines(driver) -> list[str]:
    return [line for line in text_of(driver, "output").splitlines() if line.startswith("line-")]


def test_live_output_cancel_and_requeue_in_the_browser(fenv, dashboard, browser):
    fixed = fenv.tmp / "fixed"
    (chatty,) = fenv.push("echo '<b>not bold</b>'; i=0; while true; do echo line-$i; "
                          "i=$((i+1)); sleep 0.2; done")
    (flaky,) = fenv.push(f"if [ -e {fixed} ]; then echo fixed-now; else echo boom; exit 3; fi",
                         extra=("--max-attempts", "1"))
    fenv.supervisor("--worker-id", "w-a", *BROWSER_FAST)
    fenv.supervisor("--worker-id", "w-b", *BROWSER_FAST)
    wait_for(lambda: fenv.state(chatty) == "running" and fenv.state(flaky) == "failed", 30,
             what="the chatty task running and the flaky one failed")
    d = dashboard(token=True)
    login(browser, d.url)

    # the live output: new lines arrive while the page stays loaded
    browser.get(d.url + f"/tasks/{chatty}")
    browser.execute_script("window.__same_page = 1")
    wait_for(lambda: len(_lines(browser)) >= 3, 30, what="the first output lines")
    seen = len(_lines(browser))
    wait_for(lambda: len(_lines(browser)) >= seen + 5, 30, what="new lines without a reload")
    assert browser.execute_script("return window.__same_page") == 1, "the page was reloaded"
    assert "<b>not bold</b>" in text_of(browser, "output"), "output is shown as text"
    assert not browser.find_elements("css selector", "#output b")
    assert "running" in text_of(browser, "task-state")
    shoot(browser, "task-live")

    # cancel with the button: the worker stops it, the page says cancelled
    click(browser, "cancel")
    wait_for(lambda: fenv.state(chatty) == "failed", 30, what="the task cancelled")
    assert fenv.job(chatty)["reason"].startswith("cancelled by alice@dashboard")
    reload_until(browser, lambda b: "cancelled" in text_of(b, "task-state"), 20,
                  what="cancelled on the task page")
    wait_for(lambda: text_of(browser, "output-status") == "complete", 20,
             what="the output marked complete")
    wait_for(lambda: "alice@dashboard" in text_of(browser, "attempts"), 20,
             what="cancelled by alice in the attempts table")

    # requeue the failed task from the failed page: it runs again (and succeeds this time)
    browser.get(d.url + "/failed")
    cards = {e.get_attribute("data-id") for e in browser.find_elements("css selector",
                                                                          ".card")}
    assert cards == {chatty, flaky}
    assert "boom" in browser.find_element("css selector", f'.card[data-id="{flaky}"]').text
    shoot(browser, "failed")
    fixed.touch()
    click(browser, f"requeue-{flaky}")
    wait_for(lambda: fenv.state(flaky) == "succeeded", 30, what="the requeued task ran")
    browser.get(d.url + f"/tasks/{flaky}")
    # a requeue starts the attempts again at 1, whose output (complete) then grows:
    # reload until the output thread has written it
    reload_until(browser, lambda b: wait_for(lambda: text_of(b, "output-status"), 10)
                  and "fixed-now" in text_of(b, "output"), 20, what="its new output")
    assert "succeeded" in text_of(browser, "task-state")
    shoot(browser, "task-done")
    browser.get(d.url + "/failed")
    assert {e.get_attribute("data-id") for e in browser.find_elements("css selector",
                                                                       ".card")} == {chatty}
    assert f"action requeue {flaky} on queue default by alice@dashboard" in d.stderr()

    # issue 30 (1): the tasks browser -- filter by state, select two, cancel after confirming
    later = [fenv.push(f"echo later-{i}", extra=("--delay", "1h"))[0] for i in range(2)]
    browser.get(d.url + "/tasks")
    shown = {e.get_attribute("data-id") for e in browser.find_elements("css selector",
                                                                        "#tasks tbody tr")}
    assert shown == {chatty, flaky, *later}
    click(browser, "state-delayed")
    click(browser, "filter-apply")
    wait_for(lambda: "state=delayed" in browser.current_url, 10, what="the filtered page")
    rows = browser.find_elements("css selector", "#tasks tbody tr")
    assert sorted(r.get_attribute("data-id") for r in rows) == sorted(later)
    shoot(browser, "tasks")
    for box in browser.find_elements("css selector", '#tasks input[type="checkbox"]'):
        box.click()
    click(browser, "bulk-cancel")
    wait_for(lambda: browser.find_elements("id", "bulk-confirm"), 10, what="the confirmation")
    assert "Cancel 2 tasks?" in browser.find_element("tag name", "h1").text
    click(browser, "bulk-confirm")
    wait_for(lambda: all(fenv.state(t) == "failed" for t in later), 20,
             what="both delayed tasks cancelled")
    reload_until(browser, lambda b: "no delayed tasks" in text_of(b, "no-tasks"), 20,
                  what="the filtered page empty")
