"""Issue 25, class 6: a dashboard session ends at logout, after the idle timeout and when the
token file changes -- over real HTTP, with the cookie a browser held replayed afterwards.
Logout and the token file: a real ``jobq-ctl dashboard`` process; the idle timeout: the app
served by waitress in this process, with an injected clock."""

from __future__ import annotations

import http.cookiejar
import json
import re
import urllib.error
import urllib.parse
import urllib.request

import pytest

from supervisor.backends.sqlite.backend import SqliteBackend
from supervisor.dashboard.app import create_app
from supervisor.dashboard.data import DataSource
from supervisor.fleet.control.sqlite import SqliteControlStore
from tests.conftest import wait_for
from tests.dashboard.conftest import TOKEN, login

pytestmark = pytest.mark.timeout(90)
ENDED = "your session has ended"


class Client:
    """urllib with a cookie jar: what a browser keeps between requests."""

    def __init__(self, url: str, jar: http.cookiejar.CookieJar | None = None) -> None:
        self.url = url
        self.jar = jar if jar is not None else http.cookiejar.CookieJar()
        self._open = urllib.request.build_opener(
            urllib.request.HTTPCookieProcessor(self.jar)).open

    def request(self, path: str, fields: dict[str, str] | None = None,
                headers: dict[str, str] | None = None) -> tuple[int, str]:
        data = urllib.parse.urlencode(fields).encode() if fields is not None else None
        req = urllib.request.Request(self.url + path, data=data, headers=headers or {})
        try:
            with self._open(req, timeout=30) as resp:
                return resp.status, resp.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()

    def csrf(self, path: str = "/") -> str:
        page = self.request(path)[1]
        return re.search(r'name="csrf" value="([^"]+)"', page).group(1)

    def login(self, token: str = TOKEN) -> tuple[int, str]:
        return self.request("/login", {"csrf": self.csrf("/login"), "token": token,
                                       "name": "alice"})

    def pause(self, csrf: str) -> tuple[int, str]:
        return self.request("/queue/pause", {"csrf": csrf})

    def copy(self) -> Client:
        """Another client holding copies of this one's cookies as they are now."""
        jar = http.cookiejar.CookieJar()
        for cookie in self.jar:
            jar.set_cookie(cookie)
        return Client(self.url, jar)


def _paused(env) -> bool:
    return json.loads(env.ctl("status", "--json").stdout)["paused"]


def _logged_in(page: str) -> bool:
    return "alice@dashboard" in page and 'action="/logout"' in page \
        and ('id="pause"' in page or 'id="resume"' in page)


def test_the_cookie_of_a_logged_out_session_is_refused(env, dashboard):
    env.push("true")
    d = dashboard(token=True)
    browser = Client(d.url)
    assert browser.login()[0] == 200
    status, page = browser.request("/")
    assert status == 200 and _logged_in(page)
    stolen, csrf = browser.copy(), browser.csrf()  # the cookie as it was before the logout
    assert browser.request("/logout", {"csrf": csrf})[0] == 200
    # The old cookie, replayed: no action, no logged-in page.
    status, body = stolen.pause(csrf)
    assert _paused(env) is False
    assert status == 403 and ENDED in body, body
    assert "alice@dashboard logged out" in d.stderr()
    status, page = stolen.copy().request("/")
    assert status == 200 and not _logged_in(page)
    assert stolen.copy().request("/failed/clear")[0] == 403
    # A new login works and may act.
    again = Client(d.url)
    assert again.login()[0] == 200
    assert again.pause(again.csrf())[0] == 200 and _paused(env) is True


def test_a_changed_token_file_ends_the_sessions_of_the_old_token(env, dashboard):
    env.push("true")
    d = dashboard(token=True)
    browser = Client(d.url)
    assert browser.login()[0] == 200
    csrf = browser.csrf()
    new_token = "a-new-token-for-the-operators-42"
    (env.tmp / "token").write_text(new_token + "\n")  # the fixture's --token-file
    status, body = browser.pause(csrf)
    assert _paused(env) is False
    assert status == 403 and ENDED in body, body
    assert "changed: 1 session(s) ended" in d.stderr()
    assert not _logged_in(browser.request("/")[1])
    assert browser.login()[0] == 403, "the old token no longer logs in"
    assert browser.login(new_token)[0] == 200
    csrf = browser.csrf()
    assert browser.pause(csrf)[0] == 200 and _paused(env) is True
    # An unusable token file: no login and no session works, none is ended for good.
    (env.tmp / "token").write_text("short\n")
    assert browser.request("/queue/resume", {"csrf": csrf})[0] == 403
    assert "unusable, no login works" in d.stderr()
    status, page = Client(d.url).login(new_token)
    assert status == 403 and "the token file is unusable" in page
    (env.tmp / "token").write_text(new_token + "\n")
    assert _logged_in(browser.request("/")[1]), "the file fixed, the session is back"


@pytest.fixture
def served_app(env, served):
    """The app of one SQLite queue with the test token, a 600 s idle timeout and a clock
    that moves only when the test says: (base URL, the clock's [now])."""
    env.push("true")
    now = [1000.0]
    data = DataSource("default", lambda: SqliteBackend(str(env.db), "default", "dash"),
                      lambda: SqliteControlStore(str(env.db)))
    app = create_app(data, token=TOKEN, idle_timeout=600, clock=lambda: now[0])
    return served(app), now


def test_a_session_ends_after_the_idle_timeout_and_refreshes_do_not_keep_it(env, served_app):
    url, now = served_app
    browser = Client(url)
    assert browser.login()[0] == 200
    csrf = browser.csrf()
    now[0] += 500
    assert _logged_in(browser.request("/")[1]), "a page load: active again at +500"
    now[0] += 590  # 590 s after that page load
    refresh = {"X-Jobq-Refresh": "1"}  # what static/app.js sends with a refresh
    assert _logged_in(browser.request("/", headers=refresh)[1])
    now[0] += 20  # 610 s after the page load, 20 s after a refresh
    assert not _logged_in(browser.request("/", headers=refresh)[1]), \
        "the page's refresh did not keep the session"
    status, body = browser.pause(csrf)
    assert status == 403 and "log in" in body
    assert _paused(env) is False
    assert browser.login()[0] == 200
    now[0] += 599
    assert browser.pause(browser.csrf())[0] == 200 and _paused(env) is True


def test_an_idle_timeout_of_0_is_refused_with_one_line(env):
    res = env.ctl("dashboard", "--session-idle-timeout", "0", check=False)
    assert res.returncode == 2
    assert res.stderr.strip().splitlines() == [
        "jobq-ctl: error: dashboard: --session-idle-timeout: must be more than 0"]


def test_in_a_browser_the_cookie_it_held_before_log_out_is_refused(env, dashboard, browser):
    env.push("true")
    d = dashboard(token=True)
    login(browser, d.url)
    held = browser.get_cookie("session")["value"]
    csrf = browser.find_element("css selector", '.who input[name="csrf"]').get_attribute("value")
    browser.find_element("css selector", ".who button").click()
    wait_for(lambda: browser.find_elements("id", "login-link"), 10, what="logged out")
    replayed = Client(d.url)
    replayed.jar.set_cookie(http.cookiejar.Cookie(
        0, "session", held, None, False, "127.0.0.1", False, False, "/", True, False, None,
        False, None, None, {}))
    status, body = replayed.pause(csrf)
    assert _paused(env) is False
    assert status == 403 and ENDED in body, body
    browser.get(d.url + "/")
    assert browser.find_elements("id", "pause") == [] and browser.find_elements("id",
                                                                                "login-link")


def test_a_session_ends_at_its_maximum_age_however_active(env, served):
    env.push("true")
    now = [1000.0]
    data = DataSource("default", lambda: SqliteBackend(str(env.db), "default", "dash"),
                      lambda: SqliteControlStore(str(env.db)))
    url = served(create_app(data, token=TOKEN, idle_timeout=600, max_age=3600,
                            clock=lambda: now[0]))
    browser = Client(url)
    assert browser.login()[0] == 200
    for _ in range(7):  # a page every 500 s: never idle
        now[0] += 500
        assert _logged_in(browser.request("/")[1])
    csrf = browser.csrf()
    now[0] += 101  # 3601 s after the login
    status, body = browser.pause(csrf)
    assert status == 403 and ENDED in body, body
    assert _paused(env) is False and not _logged_in(browser.request("/")[1])
    assert browser.login()[0] == 200, "a new login starts a new age"
    assert browser.pause(browser.csrf())[0] == 200 and _paused(env) is True


def test_secure_cookies_are_sent_over_https_only(env):
    data = DataSource("default", lambda: SqliteBackend(str(env.db), "default", "dash"),
                      lambda: SqliteControlStore(str(env.db)))
    plain = create_app(data, token=TOKEN).test_client().get("/login")
    assert "Secure" not in plain.headers["Set-Cookie"]
    client = create_app(data, token=TOKEN, secure_cookies=True).test_client()
    cookie = client.get("/login", base_url="https://localhost").headers["Set-Cookie"]
    assert cookie.startswith("__Host-session=") and "; Secure" in cookie
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "Domain" not in cookie


@pytest.mark.parametrize("args,line", [
    (("--session-max-age", "0"), "--session-max-age: must be more than 0"),
    (("--allowed-hosts", "https://jobq.example.com"),
     "--allowed-hosts: 'https://jobq.example.com' is not a host name (no scheme, port or "
     "path; e.g. jobq.example.com)"),
])
def test_bad_session_and_host_options_are_refused_with_one_line(env, args, line):
    res = env.ctl("dashboard", *args, check=False)
    assert res.returncode == 2
    assert res.stderr.strip().splitlines() == [f"jobq-ctl: error: dashboard: {line}"]
