"""The fleet layer's control store: worker records, cancels, queue flags, commands for one
worker and result records, in SQLite (the queue's own file), PostgreSQL or Azure Table Storage.

``base`` is the seam (``ControlStore``, ``ControlSnapshot``, ``ControlStoreError``, the key
layout); ``records`` the versioned JSON documents; ``signing`` the HMAC signatures on
cancel/flag/command records.  See docs/architecture.rst.  The stores themselves are imported
from their own modules (``sqlite``, ``postgres``, ``azure_table``, or ``open`` to pick one):
this package re-exports only what every store stands on, so importing it never imports a store
(a worker that imports ``records`` for its results needs neither ``sqlite3`` nor an SDK) and no
store module reaches back into it round a circle.
"""

from .base import (
    ControlConfigError,
    ControlSnapshot,
    ControlStore,
    ControlStoreError,
    PurgeCounts,
    worker_state,
)
from .records import (
    Cancel,
    Command,
    QueueFlag,
    RecordError,
    ResultRecord,
    TaskInfo,
    WorkerRecord,
    new_seq,
)

__all__ = [
    "Cancel", "Command", "ControlConfigError", "ControlSnapshot", "ControlStore",
    "ControlStoreError", "PurgeCounts", "QueueFlag", "RecordError", "ResultRecord",
    "TaskInfo", "WorkerRecord", "new_seq", "worker_state",
]
