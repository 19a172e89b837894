"""The dashboard with two queues in a real headless Chromium: one real SQLite worker serves
``high,low``; the overview shows a row for each, and pausing one queue with its button stops
that queue's intake while the worker goes on taking the other's tasks."""

from __future__ import annotations

import pytest

from tests.conftest import wait_for
from tests.dashboard.conftest import login, shoot
from tests.dashboard.pages import click, reload_until, stays_pending, text_of

pytestmark = pytest.mark.timeout(120)

FAST = ("--control-interval", "1", "--heartbeat-interval", "1", "-n", "2")


def test_two_queues_overview_and_pausing_one_queue(env, dashboard, browser):
    env.push("true", extra=("--queue", "high"))
    env.push("true", extra=("--queue", "low"))
    env.supervisor("--worker-id", "w-hl", "--queue", "high,low", *FAST)
    wait_for(lambda: {r[1] for r in env.rows()} == {"succeeded"}, 30,
             what="the first task of each queue done")
    d = dashboard("--queue", "high,low", token=True)
    login(browser, d.url)
    browser.get(d.url + "/")
    reload_until(browser, lambda b: text_of(b, "count-succeeded-high") == "1"
                  and text_of(b, "count-succeeded-low") == "1"
                  and "running: 1" in text_of(b, "worker-states"), 30,
                  what="a row per queue and the one worker counted once")
    shoot(browser, "overview-queues")

    click(browser, "pause-low")
    wait_for(lambda: "PAUSED" in text_of(browser, "paused-low"), 10, what="low PAUSED")
    assert text_of(browser, "paused-high") == "no"
    # the worker sees the flag within a control interval; then low's intake stops
    wait_for(lambda: _worker_saw_pause(env), 15, what="the worker's view of low paused")
    (late_low,) = env.push("echo low", extra=("--queue", "low"))
    (late_high,) = env.push("echo high", extra=("--queue", "high"))
    wait_for(lambda: env.job(late_high)["status"] == "succeeded", 20,
             what="high's task while low is paused")
    stays_pending(env, late_low, 3.0, "a worker took low's task while paused")
    browser.get(d.url + "/")
    assert text_of(browser, "count-pending-low") == "1"
    click(browser, "resume-low")
    wait_for(lambda: env.job(late_low)["status"] == "succeeded", 20,
             what="low's task after resume")
    reload_until(browser, lambda b: text_of(b, "paused-low") == "no", 10, what="low not paused")

    # the other pages are one queue's, chosen in the switcher
    browser.get(d.url + "/failed")
    browser.find_element("id", "queue-low").click()
    wait_for(lambda: "queue=low" in browser.current_url, 10, what="the switcher to low")
    assert "current" in browser.find_element("id", "queue-low").get_attribute("class")
    shoot(browser, "failed-queues")


def _worker_saw_pause(env) -> bool:
    """The worker's record on queue low says paused (its control thread saw the flag)."""
    from supervisor.fleet.control.sqlite import SqliteControlStore

    store = SqliteControlStore(str(env.db), busy_timeout=10.0)
    try:
        return any(w.state == "paused" for w in store.workers("low"))
    finally:
        store.close()
