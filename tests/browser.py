"""A headless Chromium (Debian's chromium + chromium-driver) driven by Selenium, and the
dashboard's login form.  Shared by the browser tests (tests/dashboard/conftest.py) and
scripts/screenshots.py, so it imports no pytest; every function runs on its caller's thread.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from selenium.webdriver.remote.webdriver import WebDriver

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"


def why_no_browser() -> str | None:
    """Why no browser can be started here (a line), or None."""
    for path in (CHROMIUM, CHROMEDRIVER):
        if not os.access(path, os.X_OK):
            return f"{path} is missing (apt-get install chromium chromium-driver)"
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install -e '.[test]')"
    return None


def start_chromium(profile: Path, width: int = 1280, height: int = 800) -> WebDriver:
    """A headless Chromium with its profile in ``profile`` (the caller removes it), no
    network of its own (no sync, updates or QUIC): it talks only to the pages it is sent to.
    The caller quits it."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage",
                 f"--window-size={width},{height}", f"--user-data-dir={profile}"):
        opts.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)
    driver.set_page_load_timeout(30)
    return driver


def set_viewport(driver: WebDriver, w: int, h: int) -> None:
    """The viewport (not the window) at w x h, through the DevTools protocol; under 600 px
    wide it is a phone's (mobile emulation)."""
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                           {"width": w, "height": h, "deviceScaleFactor": 1, "mobile": w < 600})


def login(driver: WebDriver, url: str, token: str, name: str, timeout: float = 10) -> None:
    """Log in through the dashboard's login form at ``url``; wait until a page shows the
    logged-in header (its log-out form)."""
    from selenium.webdriver.support.wait import WebDriverWait

    driver.get(url + "/login")
    driver.find_element("id", "name").send_keys(name)
    driver.find_element("id", "token").send_keys(token)
    driver.find_element("id", "login-submit").click()
    WebDriverWait(driver, timeout).until(
        lambda d: d.find_elements("css selector", ".who form"), message="logged in")
