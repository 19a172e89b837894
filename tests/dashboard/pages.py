"""Helpers that read and drive the dashboard's pages, shared by the dashboard tests: plain HTTP
(``get``), Flask's test client (``client_login``, ``csrf_of``) and a Selenium driver
(``text_of``, ``click``, ``reload_until``)."""

from __future__ import annotations

import re
import time
import urllib.error
import urllib.request

from tests.conftest import wait_for
from tests.dashboard.conftest import TOKEN


def get(url: str, data: bytes | None = None) -> tuple[int, str]:
    req = urllib.request.Request(url, data=data, method="POST" if data is not None else "GET")
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def client_login(client, token: str = TOKEN, name: str = "alice") -> int:
    page = client.get("/login").get_data(as_text=True)
    csrf = re.search(r'name="csrf" value="([^"]+)"', page).group(1)
    return client.post("/login", data={"csrf": csrf, "token": token,
                                       "name": name}).status_code


def csrf_of(client, page: str = "/") -> str:
    return re.search(r'name="csrf" value="([^"]+)"',
                     client.get(page).get_data(as_text=True)).group(1)


BROWSER_FAST = ("--control-interval", "1", "--heartbeat-interval", "1", "-n", "3")


def text_of(driver, element_id: str) -> str:
    from selenium.common.exceptions import WebDriverException

    try:
        return driver.find_element("id", element_id).text
    except WebDriverException:
        # missing, stale, or (Chromium 156) "Node with given id does not belong to the
        # document": the page's own refresh replaced #live between find and read
        return ""


def reload_until(driver, cond, timeout: float, what: str) -> None:
    """Reload the page until ``cond(driver)`` holds (the page also refreshes itself)."""
    def check() -> bool:
        driver.refresh()
        return bool(cond(driver))
    wait_for(check, timeout, interval=0.3, what=what)


def click(driver, element_id: str) -> None:
    """Click a button by id; the page's own refresh may replace it under us, so look it up
    again until the click lands."""
    from selenium.common.exceptions import WebDriverException

    def attempt() -> bool:
        try:
            driver.find_element("id", element_id).click()
            return True
        except WebDriverException:  # missing, stale or detached (see text_of)
            return False
    wait_for(attempt, 10, what=f"button {element_id}")


def stays_pending(env, task: str, seconds: float, why: str) -> None:
    """Intake stopped: for ``seconds`` (several control intervals) ``task`` stays pending."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert env.state(task) == "pending", why
        time.sleep(0.2)
