"""The fleet layer's control store: worker records, cancels, queue flags, commands for one
worker and result records, in SQLite (the queue's own file) or Azure Table Storage.

``base`` is the seam (``ControlStore``, ``ControlSnapshot``, ``ControlStoreError``, the key
layout); ``records`` the versioned JSON documents; ``signing`` the HMAC signatures on
cancel/flag/command records.  See docs/architecture.rst.  The Azure store is imported from
``supervisor.fleet.control.azure_table`` only where it is used (it needs azure-data-tables), and
the SQLite store at its first use (a worker that imports ``records`` for its results does
not need ``sqlite3``).
"""

from typing import TYPE_CHECKING

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
    "SqliteControlStore", "TaskInfo", "WorkerRecord", "new_seq", "worker_state",
]

if TYPE_CHECKING:
    from .sqlite import SqliteControlStore


def __getattr__(name: str) -> object:
    """``SqliteControlStore``, imported when first asked for (PEP 562)."""
    if name == "SqliteControlStore":
        from .sqlite import SqliteControlStore

        return SqliteControlStore
    raise AttributeError(name)
