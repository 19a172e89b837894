"""The lease pool checks a connection before lending it only after a lease call failed
(deadlines.CallDeadlines.check/suspect): a round trip before every settlement and renewal
was a good part of a short task's cost; after a failure (a server restart leaves every idle
connection dead) each connection is checked once before it is lent again."""

from __future__ import annotations

import pytest

from supervisor.backends.postgres import deadlines
from supervisor.backends.postgres.deadlines import CallDeadlines

pytestmark = pytest.mark.timeout(30)


class Conn:
    """Stands in for a pooled connection: the check's round trip is recorded, not made."""


def test_a_connection_is_checked_only_after_a_failed_call(monkeypatch) -> None:
    checked: list[Conn] = []
    monkeypatch.setattr(deadlines.ConnectionPool, "check_connection",
                        staticmethod(checked.append))
    calls = CallDeadlines()
    one, two = Conn(), Conn()
    calls.check(one)
    calls.check(two)
    assert checked == []  # no failure yet: lent without a round trip
    calls.suspect()  # a lease call failed
    calls.check(one)
    calls.check(one)
    calls.check(two)
    assert checked == [one, two]  # each once after the failure
    calls.suspect()
    calls.check(two)
    assert checked == [one, two, two]
