"""Short task ids: any unique prefix of ``MIN_PREFIX`` or more characters names a task, in
every ``jobq-ctl`` command that takes a task id (logs, result, cancel, requeue) and in the
dashboard's search.  The caller's thread (jobq-ctl's main thread, a dashboard request
thread), on the clients it already has open.

Where a prefix is looked up (docs/fleet-internals.rst, "Short task ids"):

* the queue, where it indexes its tasks by id (``QueueAdmin.ids_starting``: SQLite and
  PostgreSQL, a range of the index on the ids) -- every task it keeps;
* the control store (``ControlStore.task_ids``: the result records of every attempt that
  started and the cancels, kept 7 days; the running tasks of the worker records);
* the output store (``OutputStore.task_ids``: the tasks whose output is kept).

On Storage Queue and Service Bus, which keep no index of their messages, a prefix therefore
finds what the fleet layer knows: a task that started (or was cancelled) in the last 7 days,
or whose output is kept -- not a task still pending that nothing has touched.

An id that matches nothing is returned as it is: the command says "no task" as it says for
any unknown id.  A full id (``is_made_id``: 32 hex digits, a GUID) is never looked up.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Union

from ..core.options import UsageError
from ..core.task import MAX_ID, is_made_id

if TYPE_CHECKING:  # types only: jobq-ctl's guards ask may_be_prefix before opening a store
    from ..backends.base import QueueAdmin
    from ..fleet.control.base import ControlStore
    from ..fleet.output.base import OutputStore

MIN_PREFIX = 8  # characters: shorter is never taken for a prefix
SHOWN = 5  # candidates an ambiguous prefix names (one more tells that there are more)


class AmbiguousId(UsageError):
    """A prefix that several tasks' ids start with: one line naming them, exit status 2."""

    def __init__(self, prefix: str, queue: str, found: Sequence[str]) -> None:
        more = ", ..." if len(found) > SHOWN else ""
        super().__init__(f"task id prefix {prefix!r} is ambiguous in queue {queue}: "
                         f"{', '.join(found[:SHOWN])}{more}")
        self.prefix, self.found = prefix, list(found)


def may_be_prefix(text: str) -> bool:
    """Whether ``text`` is looked up as a prefix: long enough, not a full id."""
    return MIN_PREFIX <= len(text) < MAX_ID and not is_made_id(text)


def candidates(prefix: str, queue: str, admin: Union[QueueAdmin, None],
               store: Union[ControlStore, None], output: Union[OutputStore, None],
               limit: int = SHOWN + 1) -> list[str]:
    """Up to ``limit`` ids, in order, that start with ``prefix`` in what is open (module
    docstring).  Raises the backend's and stores' errors."""
    found: set[str] = set()
    if admin is not None:
        found.update(admin.ids_starting(prefix, limit))
    if store is not None:
        found.update(store.task_ids(queue, prefix, limit))
        found.update(t.id for w in store.workers(queue) for t in w.tasks
                     if t.id.startswith(prefix))
    if output is not None:
        found.update(output.task_ids(queue, prefix, limit))
    return sorted(found)[:limit]


def resolve(text: str, queue: str, admin: Union[QueueAdmin, None],
            store: Union[ControlStore, None], output: Union[OutputStore, None]) -> str:
    """The id ``text`` names: itself when it is a task's whole id or matches nothing, else the
    one id it is a prefix of; AmbiguousId when several start with it."""
    if not may_be_prefix(text):
        return text
    found = candidates(text, queue, admin, store, output)
    if not found or text in found:
        return text
    if len(found) > 1:
        raise AmbiguousId(text, queue, found)
    return found[0]
