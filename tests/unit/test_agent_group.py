"""AgentGroup (control/group.py): one control agent per queue of a worker's several -- pause
flags to the backend, results and acknowledgements to their queue's agent, each record's
own tasks."""

from __future__ import annotations

import queue
from types import SimpleNamespace
from typing import Any

from supervisor.backends.base import BackendBase
from supervisor.backends.multi import MultiQueueBackend
from supervisor.core.settings import Settings
from supervisor.fleet.agent import ControlAgent
from supervisor.fleet.agent_group import AgentGroup, _view_of


class Q(BackendBase):
    name = "fake"
    lost_lease_return_delay = 0.0


class FakeAgent:
    def __init__(self) -> None:
        self.paused = False
        self.cancels: dict[str, Any] = {}
        self.acked: list[Any] = []
        self.results: list[Any] = []

    def acted(self, command: Any) -> None:
        self.acked.append(command)

    def result(self, record: Any) -> None:
        self.results.append(record)


def group(on_paused: Any = print) -> tuple[AgentGroup, MultiQueueBackend, dict[str, FakeAgent]]:
    backend = MultiQueueBackend({"high": Q(), "low": Q()})  # type: ignore[dict-item]
    g = AgentGroup(backend, on_paused)
    agents = {"high": FakeAgent(), "low": FakeAgent()}
    g.agents = agents  # type: ignore[assignment]
    return g, backend, agents


def test_a_paused_queue_goes_to_the_backend_and_the_worker_pauses_only_when_all_are() -> None:
    worker: list[bool] = []  # what the worker's on_paused heard
    g, backend, agents = group(worker.append)
    agents["low"].paused = True
    g.queue_paused(True)
    assert backend.paused == {"low"} and worker == [False]
    agents["high"].paused = True
    g.queue_paused(True)
    assert backend.paused == {"high", "low"} and worker[-1] is True
    agents["low"].paused = False
    g.queue_paused(False)
    assert backend.paused == {"high"} and worker[-1] is False


def test_results_and_acknowledgements_go_to_their_queues_agent() -> None:
    g, _, agents = group()
    g.result(SimpleNamespace(queue="low"))  # type: ignore[arg-type]
    g.acted(SimpleNamespace(queue="high"))  # type: ignore[arg-type]
    g.result(SimpleNamespace(queue="gone"))  # type: ignore[arg-type]
    assert len(agents["low"].results) == 1 and len(agents["high"].acked) == 1
    assert len(agents["high"].results) == 1  # an unknown queue: the first agent's


def test_each_record_shows_its_queues_tasks_and_counts() -> None:
    from supervisor.core.outcome_counts import OutcomeCounts

    def lease(name: str) -> Any:
        return SimpleNamespace(queue=name)
    tasks = (SimpleNamespace(lease=lease("high")), SimpleNamespace(lease=lease("low")),
             SimpleNamespace(lease=lease("low")))
    totals = OutcomeCounts(succeeded=7, failed=2)
    totals.per_queue = {"high": {"succeeded": 5, "failed": 0},
                        "low": {"succeeded": 2, "failed": 2}}
    view = lambda: ("running", tasks, 4, totals)  # noqa: E731
    state, mine, slots, counts = _view_of(view, "low")()
    assert mine == tasks[1:] and slots == 4 and counts == {"succeeded": 2, "failed": 2}
    assert _view_of(view, "high")()[1:] == (tasks[:1], 4, {"succeeded": 5, "failed": 0})
    assert _view_of(view, "idle")()[3] == {}  # nothing finished from it yet
    # per_queue is a field every OutcomeCounts has (typed; no getattr with a default)
    fresh = lambda: ("idle", (), 1, OutcomeCounts(succeeded=1))  # noqa: E731
    assert OutcomeCounts().per_queue == {} and _view_of(fresh, "low")()[3] == {}


def test_for_worker_one_agent_per_queue_or_none() -> None:
    backend = MultiQueueBackend({"high": Q(), "low": Q()})  # type: ignore[dict-item]
    events: queue.SimpleQueue[Any] = queue.SimpleQueue()
    args = (events.put, events.put, lambda: None, lambda: ("running", (), 1, {}), ())
    off = Settings(queue="high,low", control="off")
    assert AgentGroup.for_worker(off, *args, backend) is None  # type: ignore[arg-type]
    g = AgentGroup.for_worker(Settings(queue="high,low"), *args, backend)  # type: ignore
    assert isinstance(g, AgentGroup) and list(g.agents) == ["high", "low"]
    assert [a.queue for a in g.agents.values()] == ["high", "low"]
    g.agents["low"].cancels["t1"] = "c"
    assert g.cancels.get("t1") == "c" and bool(g.cancels)
    single = AgentGroup.for_worker(Settings(queue="one"), *args, Q())  # type: ignore
    assert isinstance(single, ControlAgent) and single.queue == "one"
