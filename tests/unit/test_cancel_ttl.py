"""``jobq-ctl cancel --cancel-ttl``: a cancel applies for its own ttl (absent: 7 days, so records
written before the field existed read as before).  The control agent, driven with an injected
clock against a real SQLite control store, drops a cancel from the cache the launcher reads at
claim time once the ttl has passed, and never applies an expired one to a running task."""

from __future__ import annotations

import json
from typing import Any

import pytest
from test_control_agent import T0, agent_for, store  # noqa: F401 (fixture)

from supervisor.fleet.control import Cancel
from supervisor.fleet.control.records import CANCEL_TTL, RecordError, decode, encode
from supervisor.fleet.control.signing import canonical
from tests.fakes.clock import FakeClock
from tests.fakes.worker import make_task

pytestmark = pytest.mark.timeout(30)

WHEN = 1e9  # agent_for's wall clock at T0


def cancel(task_id: str, ttl: float | None = None, when: float = WHEN) -> Cancel:
    return Cancel(queue="q", task_id=task_id, reason="why", who="ops", when=when, grace=30.0,
                  ttl=ttl)


# ------------------------------------------------------------------------------ records
def test_ttl_is_optional_and_a_default_cancel_is_the_same_document_as_before() -> None:
    plain = cancel("t1")
    doc = json.loads(encode(plain))
    assert "ttl" not in doc and b"ttl" not in canonical(plain)  # old signatures still verify
    assert decode(encode(plain)) == plain and plain.expires() == WHEN + CANCEL_TTL
    short = cancel("t1", ttl=90)
    assert json.loads(encode(short))["ttl"] == 90.0
    assert decode(encode(short)) == short and short.expires() == WHEN + 90
    assert b'"ttl":90' in canonical(short)  # covered by the signature


@pytest.mark.parametrize("ttl", [0, -5, "1h", True, float("inf")])
def test_a_bad_ttl_is_a_bad_record(ttl: Any) -> None:
    doc = {"v": 1, "kind": "cancel", "queue": "q", "task_id": "t", "reason": "", "who": "ops",
           "when": WHEN, "grace": 0.0, "ttl": ttl}
    with pytest.raises(RecordError):
        decode(json.dumps(doc))


# -------------------------------------------------------------------------------- agent
def test_a_cancel_stops_applying_at_its_ttl(store) -> None:  # noqa: F811
    clock = FakeClock(T0)
    tasks: list[Any] = []
    agent, _, wakes = agent_for(store, clock, tasks)
    store.put_cancel(cancel("short", ttl=10))
    store.put_cancel(cancel("default"))
    agent._poll()
    cache = agent.cancels
    assert set(cache) == {"short", "default"}
    # the control thread sleeps no longer than until the next expiry
    assert agent.directives.expire() == WHEN + 10
    clock.now = T0 + 9.9
    assert agent.directives.expire() == WHEN + 10 and "short" in cache
    clock.now = T0 + 10
    assert agent.directives.expire() == WHEN + CANCEL_TTL
    assert set(agent.cancels) == {"default"} and agent.cancels is cache  # the launcher's dict
    # a task with the expired cancel's id starting now is not touched, not even by a full poll
    rt = make_task(clock)
    rt.task_id = "short"
    tasks.append(rt)
    clock.now = T0 + 100  # past the cache refresh: every live cancel is read again
    agent._poll()
    assert rt.cancel is None and wakes == [] and set(agent.cancels) == {"default"}
    clock.now = T0 + CANCEL_TTL - 1
    agent._poll()
    assert set(agent.cancels) == {"default"}
    clock.now = T0 + CANCEL_TTL
    agent.directives.expire()
    assert agent.cancels == {}


def test_an_expired_cancel_is_never_applied_to_a_running_task(store) -> None:  # noqa: F811
    clock = FakeClock(T0)
    rt = make_task(clock)  # task id t1
    agent, _, wakes = agent_for(store, clock, [rt])
    store.put_cancel(cancel("t1", ttl=5, when=WHEN - 6))
    agent._poll()
    assert rt.cancel is None and wakes == [] and agent.cancels == {}
    store.put_cancel(cancel("t1", ttl=5, when=WHEN - 4))  # a later cancel still in its ttl
    clock.now = T0 + 0.5
    agent._poll()
    assert rt.cancel is not None and wakes == [1]
