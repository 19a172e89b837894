"""dashboard/edges.py: which Host names are answered, which ``back=`` targets are followed,
and the login throttle's bounds with an injected clock (issue 39 §5)."""

from __future__ import annotations

import pytest

from supervisor.dashboard.edges import HostCheck, LoginThrottle, host_name, local_path

pytestmark = pytest.mark.timeout(30)


def test_host_names_are_read_as_a_browser_sends_them() -> None:
    assert host_name("LocalHost.:8080") == "localhost"
    assert host_name("[::1]:8080") == "::1"
    assert host_name("jobq.example.com") == "jobq.example.com"


def test_loopback_bind_answers_loopback_names_and_its_address() -> None:
    check = HostCheck("127.0.0.1")
    for host in ("127.0.0.1:8080", "localhost:8080", "[::1]:8080", "localhost"):
        assert check.allows(host), host
    for host in ("evil.example", "127.0.0.1.evil.example", "localhost.evil.example",
                 "10.0.0.1", "", "[::ffff:10.0.0.1]"):
        assert not check.allows(host), host


def test_a_non_loopback_bind_answers_its_address_and_allowed_names_only() -> None:
    check = HostCheck("10.0.0.5", ["jobq.example.com"])
    assert check.allows("10.0.0.5:8080") and check.allows("JOBQ.example.com")
    for host in ("localhost", "127.0.0.1", "10.0.0.6", "sub.jobq.example.com"):
        assert not check.allows(host), host


def test_a_wildcard_bind_answers_any_address_literal_but_no_other_name() -> None:
    check = HostCheck("0.0.0.0", ["jobq.example.com"])
    assert check.allows("10.0.0.5:8080") and check.allows("[fe80::1]:8080")
    assert check.allows("jobq.example.com")
    assert not check.allows("rebind.evil.example:8080")


@pytest.mark.parametrize("target", ["/", "/tasks?state=failed&worker=w-1", "/failed#x",
                                    "/workers/w-1", "/tasks?q=a%2F%2Fb"])
def test_paths_on_this_site_are_followed(target: str) -> None:
    assert local_path(target)


@pytest.mark.parametrize("target", [
    "", "tasks", "//evil.example", "/\\evil.example", "/\t/evil.example", "/\n/evil",
    "/\r/evil", "/\x00/evil", "/\x1b/evil", "/\u202e/evil", "/\u200b/evil", " /x", "/x ",
    "https://evil.example", "javascript:alert(1)", "/x\\y"])
def test_other_targets_are_not(target: str) -> None:
    assert not local_path(target)


def test_failed_logins_are_bounded_per_client_and_in_all() -> None:
    now = [0.0]
    throttle = LoginThrottle(per_client=3, overall=5, window=60, clock=lambda: now[0])
    assert [throttle.attempt("a")[0] for _ in range(3)] == [0.0, 0.0, 0.0]
    assert throttle.attempt("a") == (60.0, True), "the first refusal is worth a log line"
    now[0] = 10.0
    assert throttle.attempt("a") == (50.0, False)
    assert throttle.attempt("b")[0] == throttle.attempt("b")[0] == 0.0
    assert throttle.attempt("c") == (50.0, True), "the overall bound: 5 in the window"
    now[0] = 60.0  # a's first three left the window; b's two are still in it
    assert throttle.attempt("a")[0] == 0.0
    assert throttle.attempt("c")[0] == 0.0
    assert throttle.attempt("d")[0] == 0.0
    assert throttle.attempt("e")[0] > 0, "b, b, a, c, d: the overall bound again"


def test_a_successful_login_is_not_counted_as_a_failure() -> None:
    now = [0.0]
    throttle = LoginThrottle(per_client=2, overall=10, window=60, clock=lambda: now[0])
    for _ in range(5):
        assert throttle.attempt("a")[0] == 0.0
        throttle.succeeded("a")
    assert throttle.attempt("a")[0] == throttle.attempt("a")[0] == 0.0
    assert throttle.attempt("a")[0] == 60.0
