"""MultiQueueBackend (backends/multi.py): the receive order over several queues, the queue
stamped on each lease, pause, and the capabilities; --queue validation (settings.py)."""

from __future__ import annotations

import logging
import os
from typing import Any

import pytest

from supervisor.backends.base import BackendConfigError
from supervisor.backends.multi import ERROR_LOG_EVERY, MultiQueueBackend
from supervisor.core.settings import Settings, SettingsError
from tests.fakes.backend import FakeBackend
from tests.fakes.clock import FakeClock


class FakeQueue(FakeBackend):
    """One of several queues: ``n`` tasks named ``<prefix><i>``."""

    lost_lease_return_delay = 0.0
    receive_ahead = True
    change_probe = True

    def __init__(self, prefix: str, n: int) -> None:
        super().__init__(f"{prefix}{i}" for i in range(n))
        self.queue = prefix


def multi(order: str, **sizes: int) -> MultiQueueBackend:
    return MultiQueueBackend({q: FakeQueue(q, n) for q, n in sizes.items()},  # type: ignore
                             order)


def ids(leases: list[Any]) -> list[str]:
    return [lease.message_id for lease in leases]


def test_strict_takes_from_the_first_queue_with_work_then_the_next() -> None:
    b = multi("strict", high=3, low=5)
    assert ids(b.receive(2, 60)) == ["high0", "high1"]
    assert ids(b.receive(3, 60)) == ["high2", "low0", "low1"]
    # the first receive never asked low: high had all it wanted
    assert b.backends["low"].calls == [2]  # type: ignore[attr-defined]
    assert ids(b.receive(9, 60)) == ["low2", "low3", "low4"]
    assert b.receive(1, 60) == []


def test_round_robin_alternates_and_goes_on_after_the_last_queue_served() -> None:
    b = multi("round-robin", high=4, low=4)
    got = []
    for _ in range(4):
        got += ids(b.receive(1, 60))
    assert got == ["high0", "low0", "high1", "low1"]
    assert ids(b.receive(3, 60)) == ["high2", "low2", "high3"]
    assert ids(b.receive(3, 60)) == ["low3"]


def test_round_robin_gives_an_empty_queues_share_to_the_others() -> None:
    b = multi("round-robin", a=0, b=5, c=1)
    assert ids(b.receive(6, 60)) == ["b0", "c0", "b1", "b2", "b3", "b4"]


def test_every_lease_carries_its_queue(tmp_path) -> None:
    """``Lease.queue``: a backend's leases name its queue, so that a worker's several queues
    (real SQLite backends behind the MultiQueueBackend) hand out leases that say where each
    came from, and a single queue's lease names the worker's queue."""
    from dataclasses import replace

    from supervisor.backends import open_backend
    from supervisor.core.task import Task

    base = Settings(sqlite_path=str(tmp_path / "q.db"), worker_id="w")
    for name in ("high", "low", "default"):
        ctl = open_backend(replace(base, queue=name), for_ctl=True)
        ctl.push([Task(cmd=f"echo {name}")])
        ctl.close()
    several = open_backend(replace(base, queue="high,low"))
    assert isinstance(several, MultiQueueBackend)
    leases = several.receive(3, 60)
    assert [(lease.queue, lease.task and lease.task.cmd) for lease in leases] == [
        ("high", "echo high"), ("low", "echo low")]
    several.close()
    one = open_backend(base)
    assert [lease.queue for lease in one.receive(3, 60)] == ["default"]
    one.close()


def test_a_paused_queue_is_skipped() -> None:
    for order in ("strict", "round-robin"):
        b = multi(order, high=2, low=2)
        b.paused = frozenset({"high"})
        assert ids(b.receive(4, 60)) == ["low0", "low1"]
        b.paused = frozenset({"high", "low"})
        assert b.receive(4, 60) == []


def test_capabilities_only_when_every_queue_has_them_and_close_closes_all() -> None:
    b = multi("strict", a=2, b=1)
    assert b.receive_ahead and b.change_probe and not b.quick_settle
    assert b.size() == 3
    with pytest.raises(BackendConfigError, match="--queue"):
        b.push([])
    b.close()
    assert all(q.closed for q in b.backends.values())  # type: ignore[attr-defined]


@pytest.mark.parametrize("value,problem", [("a,,b", "empty"), ("a,b,a", "twice"),
                                           ("a,", "empty"), ("a,b c", "invalid")])
def test_bad_queue_lists(value: str, problem: str) -> None:
    with pytest.raises(SettingsError, match=f"^--queue: .*{problem}"):
        Settings(queue=value).validate()


def test_queue_list_and_order() -> None:
    s = Settings(queue="high, default,low", queue_order="round-robin")
    s.validate()
    assert s.queues == ("high", "default", "low")
    with pytest.raises(SettingsError, match="^--queue-order"):
        Settings(queue_order="fifo").validate()


class Failing(FakeQueue):
    def __init__(self, exc: Exception) -> None:
        super().__init__("x", 0)
        self.exc = exc

    def receive(self, max_messages: int, lock_duration: float) -> list[Any]:
        raise self.exc


@pytest.mark.parametrize("order", ["strict", "round-robin"])
def test_a_failing_queue_never_loses_the_leases_taken_from_another(order: str) -> None:
    from supervisor.backends.base import BackendError

    b = MultiQueueBackend({"high": FakeQueue("high", 1), "mid": Failing(BackendError("down")),
                           "low": FakeQueue("low", 2)}, order)  # type: ignore[dict-item]
    assert sorted(ids(b.receive(3, 60))) == ["high0", "low0", "low1"]
    with pytest.raises(BackendError, match="down"):  # nothing but the failure: the worker's
        b.receive(3, 60)
    b.backends["mid"] = Failing(BackendConfigError("bad"))  # type: ignore[assignment]
    b.backends["low"] = FakeQueue("low", 2)  # type: ignore[assignment]
    with pytest.raises(BackendConfigError):
        b.receive(3, 60)


def test_ini_and_env_take_the_comma_separated_list(tmp_path, monkeypatch) -> None:
    from supervisor.worker.main import UsageError, parse_worker_settings

    for name in [n for n in os.environ if n.startswith("JOBQ_")]:
        monkeypatch.delenv(name)
    cfg = tmp_path / "w.ini"
    cfg.write_text("[jobq-supervisor]\nqueue = high,default,low\nqueue-order = round-robin\n")
    s = parse_worker_settings(["--config", str(cfg)])
    assert s.queues == ("high", "default", "low") and s.queue_order == "round-robin"
    monkeypatch.setenv("JOBQ_QUEUE", "a,b")
    monkeypatch.setenv("JOBQ_QUEUE_ORDER", "strict")
    s = parse_worker_settings(["--config", str(cfg)])
    assert s.queues == ("a", "b") and s.queue_order == "strict"
    monkeypatch.setenv("JOBQ_QUEUE", "a,,b")
    with pytest.raises(UsageError, match="^--queue: empty"):
        parse_worker_settings([])


def test_a_queue_failing_beside_others_is_one_line_a_minute(caplog) -> None:
    """The line beside leases (core/backoff.py's helper in its own words): once a minute at
    most, whichever queue fails, and no recovery line.  Injected clock."""
    from supervisor.backends.base import BackendError

    caplog.set_level(logging.INFO)
    clock = FakeClock(100.0)
    b = MultiQueueBackend({"high": Failing(BackendError("high is down")),  # type: ignore
                           "low": FakeQueue("low", 9)}, clock=clock)
    assert len(b.receive(1, 60)) == 1
    clock.now += ERROR_LOG_EVERY - 1
    assert len(b.receive(1, 60)) == 1  # within the minute: no second line
    b.backends["high"] = FakeQueue("high", 9)  # type: ignore[assignment]
    assert len(b.receive(1, 60)) == 1  # working again: no recovery line
    b.backends["low"] = Failing(BackendError("low is down"))  # type: ignore[assignment]
    assert len(b.receive(10, 60)) == 8  # still within the first line's minute
    clock.now += 1
    b.backends["high"] = FakeQueue("high", 1)  # type: ignore[assignment]
    assert len(b.receive(10, 60)) == 1
    assert [(r.levelname, r.getMessage()) for r in caplog.records
            if r.name == "jobq.worker"] == [
        ("WARNING", "receive from queue high failed (the other queues go on): high is down"),
        ("WARNING", "receive from queue low failed (the other queues go on): low is down")]
