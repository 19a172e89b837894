"""The fleet layer of a worker with several queues (``--queue high,low``): one ControlAgent
per queue (docs/backends.rst, "Several queues per worker").

Each agent is what a single-queue worker has: its own control thread and store, polling its
own queue's partition (flag, cancels, commands) every control interval and upserting one
worker record in that queue -- so ``jobq-ctl workers/cancel/pause/drain --queue NAME`` work
unchanged, and an extra queue costs one more poll and heartbeat per interval.  A record lists
only its queue's running tasks and its queue's outcome counters (succeeded, failed: of the
tasks that came from that queue, ``Settlement.per_queue``), so that each queue's dashboard
sees what this worker finished of it and a sum over records counts each task once.

A paused queue is skipped by receive (``MultiQueueBackend.paused``); the worker itself is
paused (its ``on_paused(True)``) only when every queue is.
"""

from __future__ import annotations

import threading
from collections import ChainMap
from collections.abc import Sequence
from typing import TYPE_CHECKING, Callable, Protocol, Union

from ..backends.base import Lease
from ..backends.multi import MultiQueueBackend
from ..core.outcome_counts import OutcomeCounts
from .agent import ControlAgent
from .control.records import Cancel, Command, ResultRecord
from .worker_record import RunningTaskView, View

if TYPE_CHECKING:
    from ..backends.base import Backend
    from ..core.settings import Settings
    from ..core.signing import SigningKey

ZERO: dict[str, int] = {}


class Running(RunningTaskView, Protocol):
    """What a queue's view reads of a running task (the worker's RunningTask): its lease too."""

    @property
    def lease(self) -> Lease: ...


# What the worker's view gives: ControlAgent's View, with the counts of each queue
WorkerView = tuple[str, Sequence[Running], int, OutcomeCounts]


class AgentGroup:
    """The same calls as ControlAgent's that the worker makes (main thread), fanned out."""

    def __init__(self, backend: MultiQueueBackend, on_paused: Callable[[bool], None]) -> None:
        self.agents: dict[str, ControlAgent] = {}  # in --queue order
        self.backend = backend
        self.on_paused = on_paused  # the worker's: every queue paused, or not (any more)
        self.lock = threading.Lock()  # the pause flags' (control threads, queue_paused)
        # the launcher's claim-time lookup: every agent's cache, each updated in place
        self.cancels: ChainMap[str, Cancel] = ChainMap()

    @property
    def first(self) -> ControlAgent:
        return next(iter(self.agents.values()))

    @classmethod
    def for_worker(cls, settings: Settings, on_paused: Callable[[bool], None],
                   on_command: Callable[[Command], None],
                   wake_watchdog: Callable[[], None], view: Callable[[], WorkerView],
                   keys: Sequence[SigningKey],
                   backend: Backend) -> Union[ControlAgent, AgentGroup, None]:
        """One agent (one queue), a group (several), or None with ``--control off`` (main
        thread)."""
        if len(settings.queues) == 1 or not isinstance(backend, MultiQueueBackend):
            return ControlAgent.for_worker(settings, on_paused, on_command, wake_watchdog, view,
                                           keys)
        if settings.control == "off":
            return None
        from dataclasses import replace

        group = cls(backend, on_paused)
        for name in settings.queues:
            agent = ControlAgent.for_worker(replace(settings, queue=name), group.queue_paused,
                                            on_command, wake_watchdog, _view_of(view, name),
                                            keys)
            assert agent is not None
            group.agents[name] = agent
        group.cancels = ChainMap(*(a.cancels for a in group.agents.values()))
        return group

    def queue_paused(self, paused: bool) -> None:
        """One queue's agent saw its pause flag change (its control thread): the backend
        skips the paused queues, and the worker hears whether all are."""
        # Under one lock, computed and sent: two queues' threads changing their flags at
        # once must not leave the worker with the answer computed first.
        with self.lock:
            self.on_paused(self.paused_changed())

    def paused_changed(self) -> bool:
        """Give the backend the paused queues; True when all are (control thread)."""
        paused = frozenset(q for q, a in self.agents.items() if a.paused)
        self.backend.paused = paused
        return len(paused) == len(self.agents)

    def start(self) -> None:
        for agent in self.agents.values():
            agent.start()

    def wait_first_poll(self) -> bool:
        return all([agent.wait_first_poll() for agent in self.agents.values()])

    def acted(self, command: Command) -> None:
        """Acknowledged by the agent of the command's queue."""
        self.agents.get(command.queue, self.first).acted(command)

    def result(self, record: ResultRecord) -> None:
        """Written by the agent of the record's queue."""
        self.agents.get(record.queue, self.first).result(record)

    def stop(self, clean: bool) -> None:
        for agent in self.agents.values():
            agent.stop(clean)


def _view_of(view: Callable[[], WorkerView], name: str) -> Callable[[], View]:
    """The worker's view as one queue's record shows it: its tasks and its outcome counts
    only (control thread)."""
    def queue_view() -> View:
        state, tasks, slots, totals = view()
        mine = tuple(rt for rt in tasks if rt.lease.queue == name)
        return state, mine, slots, totals.per_queue.get(name, ZERO)
    return queue_view
