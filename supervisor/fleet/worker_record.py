"""The worker record a control thread upserts every heartbeat interval (fleet/agent.py): the
registry ``jobq-ctl workers``, ``status`` and the dashboard read -- who the worker is (host,
pid, version, start), its state, its running tasks as the worker's view gives them, and its
outcome counts.  The worker's running tasks are read through ``RunningTaskView`` (the worker's
RunningTask, by duck typing: the fleet layer never imports the worker).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Sequence
from typing import TYPE_CHECKING, Callable, Protocol, Union

from ..core.build import version
from .control.records import CMD_CHARS, Cancel, TaskInfo, WorkerRecord

if TYPE_CHECKING:
    from ..core.task import Task


class _Process(Protocol):
    @property
    def pid(self) -> int: ...


class _Keeper(Protocol):
    @property
    def expires(self) -> float: ...  # monotonic time the lease may be handed out again


class RunningTaskView(Protocol):
    """What the control thread reads of a worker's running task (the worker's RunningTask),
    and ``cancel``, which it sets once."""

    cancel: Union[Cancel, None]
    # Fields of the worker's RunningTask dataclass as they are (the main thread writes
    # ``exited_at``); the properties below are narrower views of its fields' types.
    task_id: str
    attempt: int
    task: Union[Task, None]
    started: float
    exited_at: Union[float, None]

    @property
    def lease(self) -> object: ...
    @property
    def proc(self) -> _Process: ...
    @property
    def keeper(self) -> _Keeper: ...


# (state, tasks, slots total, outcome counts): what the worker record shows (ControlAgent)
View = tuple[str, Sequence[RunningTaskView], int, dict[str, int]]


class Registration:
    """This worker in its queue's registry: its identity, fixed at start, and the record of
    each heartbeat (the control thread).  ``view`` gives (state, tasks, slots total, outcome
    counts): state one of records.WORKER_STATES, tasks a snapshot (a tuple) of the worker's
    running tasks."""

    def __init__(self, queue: str, worker_id: str, interval: float, view: Callable[[], View],
                 clock: Callable[[], float], wall: Callable[[], float]) -> None:
        self.queue = queue
        self.worker_id = worker_id
        self.interval = interval  # s between heartbeats: readers tell "lost" by it
        self.view = view
        self.clock = clock
        self.wall = wall
        self.started_wall = wall()
        self.host = socket.gethostname()

    def record(self, paused: bool) -> WorkerRecord:
        """The worker record as of now; ``paused``: the queue's pause flag as last polled."""
        state, tasks, slots, counts = self.view()
        mono, wall = self.clock(), self.wall()
        infos = []
        for rt in tasks:
            if rt.exited_at is not None:
                continue
            cmd = rt.task.cmd if rt.task is not None else ""
            names = tuple(sorted(rt.task.env)) if rt.task is not None else ()
            infos.append(TaskInfo(id=rt.task_id, attempt=rt.attempt, pid=rt.proc.pid,
                                  started=wall - (mono - rt.started),
                                  lease_expires=wall + rt.keeper.expires - mono,
                                  cmd=cmd[:CMD_CHARS], env_names=names))
        if state == "running" and paused:
            state = "paused"
        return WorkerRecord(id=self.worker_id, queue=self.queue, host=self.host,
                            pid=os.getpid(), version=version(), state=state,
                            slots_used=len(infos), slots_total=slots,
                            started=self.started_wall, heartbeat=wall,
                            interval=self.interval, tasks=tuple(infos),
                            succeeded=counts.get("succeeded", 0),
                            failed=counts.get("failed", 0) + counts.get("dead_lettered", 0))
