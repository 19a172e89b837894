"""Unique keys through the control store, for a backend whose service has no index of its
messages (Storage Queue): ``jobq-ctl push --unique-key`` claims the key in the store before
it pushes (docs/backends.rst, "Scheduling").

A claim (base.UniqueClaim, partition "u:<queue>") names the task that holds the key.  A push
creates it atomically; when it exists, the push is skipped while its task may still be
pending or running, and takes it over (a replace conditional on the etag it read, so two
pushes cannot both win) once the task has ended for good -- its final result record exists
-- or the claim is older than CLAIM_MAX_AGE (a message lives at most 7 days).  The worker's
control thread releases the claim when the task ends for good (``release_final``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Callable

from .base import CLAIM_TTL, DAY, ControlStore, ControlStoreError, UniqueClaim
from .records import ResultRecord

if TYPE_CHECKING:
    from ...core.task import Task

log = logging.getLogger("jobq.control")
CLAIM_MAX_AGE = CLAIM_TTL  # the longest a Storage Queue message lives (its default TTL)
TRIES = 3  # create/read/replace rounds against concurrent pushes of the same key


def _ended(store: ControlStore, held: UniqueClaim, now: float) -> bool:
    if not held.task_id or now - held.when > CLAIM_MAX_AGE:
        return True
    return any(r.final for r in store.results_of(held.queue, held.task_id))


def claim(store: ControlStore, queue: str, key: str, task_id: str, now: float) -> str:
    """Claim ``key`` for ``task_id``; the id of the task that holds it afterwards (``task_id``
    itself: push it; another: skip).  ControlStoreError when the store cannot tell (the push
    must not go on: it could be a duplicate).  jobq-ctl's main thread."""
    mine = UniqueClaim(queue, key, task_id, now)
    for _ in range(TRIES):
        if store.create_claim(mine):
            return task_id
        held = store.get_claim(queue, key)
        if held is None:
            continue  # released between our create and our read: create again
        if not _ended(store, held, now):
            return held.task_id
        if store.replace_claim(mine, held.etag):
            return task_id
        # another push replaced it first: read again
    held = store.get_claim(queue, key)
    if held is None:
        raise ControlStoreError(f"unique key {key!r}: claimed and released {TRIES} times "
                                "while this push tried; try again")
    return held.task_id


def release_final(store: ControlStore, records: Iterable[ResultRecord]) -> None:
    """Release the claims of the tasks that ended for good in ``records`` (the control
    thread, after it wrote them).  A claim left behind (the store failed here) is taken
    over by the next push anyway, from the final result record."""
    for r in records:
        if r.final and r.unique_key:
            store.release_claim(r.queue, r.unique_key, r.task_id)


def push_unique(store: ControlStore, push: Callable[[Sequence[Task]], list[str]], queue: str,
                tasks: Sequence[Task], now: float) -> list[str]:
    """``push`` the tasks whose key this push claims (and those without a key); the ids in
    order, the holder's in place of a skipped task.  A claim or a push that fails releases
    what this push claimed (a message of several that did go out loses its claim: the
    error says the push failed, and a repeat could not tell which went out anyway).
    jobq-ctl's main thread."""
    claimed: list[Task] = []
    ids: list[str] = []
    try:
        for t in tasks:
            ids.append(claim(store, queue, t.unique_key, t.id, now) if t.unique_key else t.id)
            if t.unique_key and ids[-1] == t.id:
                claimed.append(t)
        fresh = [t for t, held in zip(tasks, ids) if held == t.id]
        pushed = iter(push(fresh) if fresh else [])
    except BaseException:
        _release(store, queue, claimed)
        raise
    return [next(pushed) if held == t.id else held for t, held in zip(tasks, ids)]


def _release(store: ControlStore, queue: str, claimed: Sequence[Task]) -> None:
    for t in claimed:
        assert t.unique_key is not None
        try:
            store.release_claim(queue, t.unique_key, t.id)
        except ControlStoreError as exc:
            log.warning("unique key %r stays claimed by task %s, never pushed (%s); a push "
                        "takes it over after %g days", t.unique_key, t.id, exc,
                        CLAIM_MAX_AGE / DAY)
