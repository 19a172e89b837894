"""The output-store seam: where each attempt's output is kept, and how it is read back.

An attempt's output is one byte stream, appended to while the task runs and then marked
complete (``finish``).  Readers address it by byte offset: ``read(key, offset)`` returns what
follows ``offset``, the offset to read from next, and whether the writer has finished -- so a
follower (``jobq-ctl logs -f``) polls ``read`` until ``complete``.

An attempt released without counting it (preemption, a worker's stop) runs again later under
the same key.  Each run's writer calls ``reopen`` before its first append: the output is no
longer complete, and a run that finds earlier output writes ``RERUN`` before its own.  So
``complete`` is not forever: a reader that saw it may see the output grow again, behind that
marker (ops/follow.py keeps following an attempt whose result says it was requeued).

Writers: one output-store thread per worker (fleet/shipper.py) -- never the main loop, never the
pump that reads the task's pipe.  Readers: jobq-ctl, the dashboard.  One instance per thread.

Every method may raise ``OutputStoreError`` (and only that) after at most a few seconds; the
message is one line without secrets.  A missing attempt is not an error: ``read`` returns an
empty, incomplete chunk and ``attempts`` an empty list.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, Union, runtime_checkable

READ_LIMIT = 4 << 20  # bytes one read returns at most
DROPPED = "\n[... {n} bytes dropped: output store unreachable ...]\n"
# The same gap when the store said it had no room (OutputStoreFull): a full disk, a quota.
DROPPED_FULL = "\n[... {n} bytes dropped: output store full (no space left) ...]\n"
# Where an attempt's stored output stops when the worker stopped before a full store took
# the rest (shipper.OutputShipper.drain).
UNSTORED_AT_EXIT = ("\n[... {n} bytes not stored: output store full (no space left) when the "
                    "worker stopped ...]\n")
TRUNCATED = "\n[... output truncated: more than {limit} bytes (--task-output-max) ...]\n"
# A preemption, a stop, or jobq-ctl requeue (which starts the count again) ran it before.
RERUN = "\n[... attempt {attempt} runs again: requeued ...]\n"


class OutputStoreError(Exception):
    """A store call failed or timed out; one line without secrets."""


class OutputStoreFull(OutputStoreError):
    """The store has no room left (ENOSPC, EDQUOT): retried like any failure, and a gap
    it causes is marked with DROPPED_FULL."""


class OutputConfigError(OutputStoreError):
    """A store that cannot work as configured (bad connection string, not authorized)."""


@dataclass(frozen=True, order=True)
class AttemptKey:
    queue: str
    task_id: str
    attempt: int


@dataclass(frozen=True)
class Chunk:
    data: bytes
    offset: int  # where the next read starts
    complete: bool  # the writer has finished: nothing follows ``data``


class OutputStore(Protocol):
    """Implemented by files.FileOutputStore and azure_blob.BlobOutputStore."""

    name: str

    def append(self, key: AttemptKey, data: bytes) -> None:
        """Add ``data`` to the end of the attempt's output (created by its first append).

        A call that raised may or may not have stored ``data``; the store makes a retry of the
        same bytes at the same position not store them twice (the caller retries with exactly
        the bytes that raised)."""
        ...

    def reopen(self, key: AttemptKey) -> int:
        """Before a run's first append: the attempt's output is live again -- no longer
        complete -- and the bytes it holds already are returned (0: none, the usual case).
        At most one store call when the attempt is new; may be retried (idempotent)."""
        ...

    def finish(self, key: AttemptKey) -> None:
        """Mark the attempt's output complete (created empty when nothing was appended)."""
        ...

    def read(self, key: AttemptKey, offset: int = 0, limit: int = READ_LIMIT) -> Chunk: ...

    def attempts(self, queue: str, task_id: str) -> list[int]:
        """The attempts of the task that have output, ascending."""
        ...

    def task_ids(self, queue: str, prefix: str, limit: int) -> list[str]:
        """Up to ``limit`` ids, in order, of the tasks of ``queue`` with output kept whose
        id starts with ``prefix`` (ops/short_ids.py)."""
        ...

    def purge(self, before: float) -> int:
        """Delete the output of attempts last written before ``before`` (epoch seconds);
        returns how many attempts were deleted."""
        ...

    def close(self) -> None: ...


class TaskWatch(Protocol):
    """A store's push of writes to some tasks' output and result records (jobq-ctl's main
    thread; ops/follow.py)."""

    def changed(self, task_id: str) -> bool:
        """True (once) when the task's output or a result record of it was written since the
        last call -- or pushes may have been lost (the listener reconnected): read now."""
        ...

    def close(self) -> None:
        """Stop pushing; its thread and connection end (idempotent)."""
        ...


@runtime_checkable
class Watchable(Protocol):
    """A store whose readers can be pushed writes (fleet/output/postgres.py: LISTEN/NOTIFY);
    the others are polled (ops/follow.py)."""

    def watch(self, queue: str, task_ids: Sequence[str],
              on_change: Callable[[], None]) -> Union[TaskWatch, None]:
        """Start pushing writes to these tasks' output and results: ``on_change`` is called
        (on the watch's own thread) when a ``changed`` turns true; None when this store does
        not push as configured (``--postgres-notify off``)."""
        ...

    def close(self) -> None: ...
