"""Dashboard test helpers: a real ``jobq-ctl dashboard`` process on a free loopback port, and
a headless Chromium driven by Selenium (tests/browser.py: Debian's chromium + chromium-driver)."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tests.browser import login as form_login
from tests.browser import set_viewport, start_chromium, why_no_browser
from tests.conftest import command, wait_for

if TYPE_CHECKING:
    from supervisor.dashboard.data import DataSource

ARTIFACTS = Path(__file__).resolve().parent / "artifacts"
TOKEN = "s3cret-token-for-tests-0123456789"
SIZES = {"desktop": (1280, 800), "phone": (390, 844)}


class Dashboard:
    """A ``jobq-ctl dashboard`` subprocess; ``url`` is read from its first stderr line."""

    def __init__(self, db: Path, tmp: Path, *args: str, token: bool = False,
                 base: list[str] | None = None, env: dict[str, str] | None = None) -> None:
        self.err_path = tmp / f"dashboard-{os.getpid()}-{id(self)}.err"
        self._err = open(self.err_path, "wb")
        extra = list(args)
        if token:
            token_file = tmp / "token"
            token_file.write_text(TOKEN + "\n")
            extra += ["--token-file", str(token_file)]
        self.proc = subprocess.Popen(
            [*command("jobq-ctl"), *(base or ["--sqlite-path", str(db)]), "dashboard",
             "--bind", "127.0.0.1:0", "--sample-interval", "1", *extra],
            stdout=subprocess.DEVNULL, stderr=self._err, cwd=tmp, start_new_session=True,
            env={**os.environ, **(env or {})})
        found = wait_for(lambda: self._url() or self.proc.poll() is not None, 30,
                         what="the dashboard's URL line")
        if not isinstance(found, str):
            raise AssertionError(f"the dashboard exited: {self.stderr()}")
        self.url = found.rstrip("/")

    def _url(self) -> str | None:
        m = re.search(r"dashboard on (http://\S+)", self.stderr())
        return m.group(1) if m else None

    def stderr(self) -> str:
        return self.err_path.read_text(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        self._err.close()


def queue_env(request):
    """The test's queue: ``fenv`` (SQLite or PostgreSQL) or ``pg`` where the test asks for
    one, else ``env`` (SQLite)."""
    name = next((n for n in ("fenv", "pg") if n in request.fixturenames), "env")
    return request.getfixturevalue(name)


@pytest.fixture
def dashboard(request):
    """``start(*args)``: a ``jobq-ctl dashboard`` on the test's queue (``queue_env``)."""
    e = queue_env(request)
    started: list[Dashboard] = []

    def start(*args: str, token: bool = False, base: list[str] | None = None,
              environ: dict[str, str] | None = None) -> Dashboard:
        d = Dashboard(getattr(e, "db", e.tmp / "jobq.db"), e.tmp, *args, token=token,
                      base=base or e.base_args(), env={**e.secret_env(), **(environ or {})})
        started.append(d)
        return d

    yield start
    for d in started:
        d.stop()


def need_browser() -> None:
    """Skip the test, saying why, where Chromium or Selenium is missing (fail under CI)."""
    why = why_no_browser()
    if why:
        if os.environ.get("CI"):  # CI must run them: scripts/test installs both
            pytest.fail(f"browser tests: {why}")
        pytest.skip(f"browser tests: {why}")


@pytest.fixture
def browser(tmp_path):
    need_browser()
    driver = start_chromium(tmp_path / "chromium", *SIZES["desktop"])
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(tmp_path / "chromium", ignore_errors=True)


def shoot(driver, name: str) -> None:
    """Screenshots of the current page at both sizes; at the phone width the page must not
    scroll sideways."""
    ARTIFACTS.mkdir(exist_ok=True)
    for size, (w, h) in SIZES.items():
        set_viewport(driver, w, h)
        driver.refresh()
        if size == "phone":
            width = driver.execute_script("return document.documentElement.scrollWidth")
            assert width <= w, f"{name}: the page scrolls sideways at {w} px ({width} px)"
        driver.save_screenshot(str(ARTIFACTS / f"{name}-{w}x{h}.png"))
    set_viewport(driver, *SIZES["desktop"])


def login(driver, url: str, name: str = "alice") -> None:
    """Log in through the login form with the test token."""
    form_login(driver, url, TOKEN, name)


def data_source(e, output: Callable[[], Any] | None = None) -> DataSource:
    """A DataSource on the test's queue ``e`` (Env or PgEnv) with the backend, control and
    output stores jobq-ctl opens for it (``output``: another output store opener)."""
    from supervisor.backends import open_backend
    from supervisor.dashboard.data import DataSource
    from supervisor.fleet.control.open import open_control_store
    from supervisor.fleet.output.open import open_output_store

    settings = e.settings()
    return DataSource(settings.queue, lambda: open_backend(settings, for_ctl=True),
                      lambda: open_control_store(settings), None,
                      output or (lambda: open_output_store(settings)))


def control_store(e) -> Any:
    """The control store of the test's queue ``e``, as jobq-ctl opens it (close it)."""
    from supervisor.fleet.control.open import open_control_store

    return open_control_store(e.settings())


class Unreachable:
    """A store whose every call raises ``error(message)``, as one that cannot be reached
    does; ``name``: the store's kind.  Closing it does nothing."""

    def __init__(self, name: str, error: type[Exception], message: str) -> None:
        self.name, self._error, self._message = name, error, message

    def __getattr__(self, attr: str):
        def fail(*args, **kwargs):
            raise self._error(self._message)
        return fail

    def close(self) -> None:
        pass


@pytest.fixture
def served():
    """``serve(app)``: a WSGI app built in the test (e.g. with an injected clock) served by
    waitress on a free loopback port, as ``jobq-ctl dashboard`` serves it; its base URL.
    Closed when the test ends."""
    import threading

    import waitress

    servers: list[tuple[Any, threading.Thread]] = []

    def serve(app) -> str:
        server = waitress.create_server(app, host="127.0.0.1", port=0, threads=2)
        thread = threading.Thread(target=server.run, name="test-dashboard", daemon=True)
        thread.start()
        servers.append((server, thread))
        return f"http://127.0.0.1:{server.effective_port}"

    yield serve
    for server, thread in servers:
        server.close()
        thread.join(10)
