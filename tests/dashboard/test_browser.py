"""The dashboard in a real headless Chromium (Selenium) with two real workers running tasks,
on SQLite and on PostgreSQL (``fenv``): the overview shows the counts and both workers, pause
stops intake and resume brings it back (buttons, after a token login), drain sends a worker
home; screenshots of every page at 1280x800 and 390x844 (no sideways scroll on the phone)."""

from __future__ import annotations

import pytest

from tests.conftest import wait_for
from tests.dashboard.conftest import TOKEN, control_store, shoot
from tests.dashboard.pages import BROWSER_FAST, click, reload_until, stays_pending, text_of

pytestmark = pytest.mark.timeout(120)

Q = "default"


def _workers(env) -> list:
    """The worker records of queue Q, read from the control store."""
    store = control_store(env)
    try:
        return list(store.workers(Q))
    finally:
        store.close()


def _states(env) -> dict[str, str]:
    return {w.id: w.state for w in _workers(env)}


def _used(env) -> dict[str, int]:
    return {w.id: w.slots_used for w in _workers(env)}


def test_overview_pause_resume_and_drain_in_the_browser(fenv, dashboard, browser):
    release = fenv.tmp / "release"
    hold = f"while [ ! -e {release} ]; do sleep 0.1; done"
    held = fenv.push(hold, hold)
    sup_a = fenv.supervisor("--worker-id", "w-a", *BROWSER_FAST)
    sup_b = fenv.supervisor("--worker-id", "w-b", *BROWSER_FAST)
    wait_for(lambda: [r[1] for r in fenv.rows()] == ["running", "running"], 30,
             what="both held tasks running")
    d = dashboard(token=True)
    browser.get(d.url + "/")
    reload_until(browser, lambda b: text_of(b, "count-running") == "2"
                  and "running: 2" in text_of(b, "worker-states")
                  and b.find_elements("css selector", ".chart line.dot.running"), 30,
                  what="the overview with 2 running tasks on 2 running workers and the "
                       "sampler's first depth samples")
    assert text_of(browser, "count-pending") == "0"
    assert browser.find_elements("id", "pause") == [], "no button before the login"
    shoot(browser, "overview")
    browser.get(d.url + "/workers")
    assert {e.get_attribute("data-id") for e in
            browser.find_elements("css selector", "tr.worker")} == {"w-a", "w-b"}
    shoot(browser, "workers")
    browser.get(d.url + "/workers/w-a")
    shoot(browser, "worker")
    browser.get(d.url + f"/tasks/{held[0]}")
    assert "running" in text_of(browser, "task-state")
    shoot(browser, "task")
    browser.get(d.url + "/tasks/no-such-task")
    assert "404" in browser.title
    shoot(browser, "not-found")

    # log in with the token, then pause with the button
    browser.get(d.url + "/login")
    shoot(browser, "login")
    browser.find_element("id", "name").send_keys("alice")
    browser.find_element("id", "token").send_keys(TOKEN)
    browser.find_element("id", "login-submit").click()
    wait_for(lambda: browser.find_elements("id", "pause"), 10, what="the pause button")
    click(browser, "pause")
    wait_for(lambda: "PAUSED" in text_of(browser, "paused"), 10,
             what="PAUSED on the overview")
    assert "alice@dashboard" in text_of(browser, "paused")
    wait_for(lambda: set(_states(fenv).values()) == {"paused"}, 15, what="both workers paused")
    (late,) = fenv.push("echo late")
    stays_pending(fenv, late, 4.0, "a worker took a task while paused")
    browser.get(d.url + "/")
    assert text_of(browser, "count-pending") == "1"
    click(browser, "resume")
    wait_for(lambda: fenv.state(late) == "succeeded", 20, what="the task after resume")
    reload_until(browser, lambda b: text_of(b, "paused") == "no", 10, what="not paused")

    # drain a busy worker with its button: it finishes its tasks and exits 0; the other stays
    busy = next(w for w, used in _used(fenv).items() if used)
    idle = ({"w-a", "w-b"} - {busy}).pop()
    sups = {"w-a": sup_a, "w-b": sup_b}
    browser.get(d.url + "/workers")
    click(browser, f"drain-{busy}")
    wait_for(lambda: _states(fenv).get(busy) == "draining", 15, what=f"{busy} draining")
    reload_until(browser, lambda b: "draining" in b.find_element(
        "css selector", f'tr.worker[data-id="{busy}"]').text, 10, what="draining shown")
    release.touch()
    assert sups[busy].wait(30) == 0
    assert sups[idle].proc.poll() is None
    assert f"action drain {busy} on queue {Q} by alice@dashboard" in d.stderr()
