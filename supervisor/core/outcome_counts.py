"""The worker's outcome counts as its fleet records show them: made by the worker
(``Settlement.snapshot``, worker/settlement.py), read by the fleet layer's control thread
(fleet/worker_record.py, fleet/agent_group.py), which never imports the worker."""

from __future__ import annotations


class OutcomeCounts(dict[str, int]):
    """Outcome name -> how many (succeeded, failed, retried, ...), and ``per_queue``: the
    counts a worker record shows by the queue the task came from (a worker's several queues:
    each queue's record gets its own)."""

    per_queue: dict[str, dict[str, int]]

    def __init__(self, counts: dict[str, int] | None = None, /, **more: int) -> None:
        super().__init__(counts or {}, **more)
        self.per_queue = {}
