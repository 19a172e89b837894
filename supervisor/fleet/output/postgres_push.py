"""jobq-ctl's followers, pushed: LISTEN on a PostgreSQL schema's ``"<S>.output"`` channel
(backends/postgres/schema.py ``output_channel``) for the tasks followed.

The output store's appends and finishes (fleet/output/postgres.py) and the control store's
result records (fleet/control/postgres.py) send ``pg_notify("<S>.output",
"queue/task_id/attempt")`` in their transactions.  One ``WakeListener``
(backends/postgres/listener.py: its own connection and thread, reconnection with back-off,
re-LISTEN, deadlines) per follow, keyed by ``queue/task_id``: a notification of a followed
task sets its flag and wakes the follower's loop (ops/follow.py), which reads at once instead
of at its next poll.  The poll stays the backstop: a notification sent while the listener was
down is lost, so every flag is set when it (re)connects.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Union

from ...backends.postgres.connect import APP_CTL, connect, one_line
from ...backends.postgres.listener import WakeListener

LISTEN_EFFECT = "output and results show at the next poll meanwhile"


def task_of(payload: str) -> str:
    """``queue/task_id`` of a payload ``queue/task_id/attempt`` (a queue has no ``/``, a
    task id may)."""
    return payload.rsplit("/", 1)[0]


class TaskListener:
    """base.TaskWatch over one queue's tasks (jobq-ctl's main thread; the listening: the
    listener's own thread)."""

    def __init__(self, listener: WakeListener, queue: str) -> None:
        self.listener = listener
        self.queue = queue

    def changed(self, task_id: str) -> bool:
        return self.listener.changed(f"{self.queue}/{task_id}")

    def close(self) -> None:
        self.listener.close()


def listen(url: Union[str, None], channel: str, queue: str, task_ids: Sequence[str],
           on_change: Callable[[], None]) -> TaskListener:
    """A started listener for ``task_ids`` of ``queue`` on ``channel`` of the database at
    ``url``; ``on_change`` is called on its thread (jobq-ctl's main thread)."""
    listener = WakeListener(
        lambda: connect(url, application_name=APP_CTL), channel,
        describe=lambda exc: one_line(exc, url), name="output store listener",
        effect=LISTEN_EFFECT, thread_name="pg-output-listener", key=task_of)
    for task_id in task_ids:
        listener.watch(f"{queue}/{task_id}")
    listener.wake = on_change
    listener.start()
    return TaskListener(listener, queue)
