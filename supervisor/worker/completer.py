"""The completer: one thread that completes the leases of succeeded tasks together, off the
main thread (a backend with ``batch_complete``: PostgreSQL; docs/architecture.rst, "The settle
path").

The main thread hands over the keepers whose task succeeded in a turn (``hand``) and goes on
receiving and spawning: it never waits for the database to complete a task.  The completer
takes everything handed over since its last call as ONE ``Backend.complete_many`` call -- the
busier the worker, the larger the batch -- and tells each keeper what became of its lease
(``LeaseKeeper.settled_together``): completed, or refused (a definitive LeaseLost for just
that lease).  A keeper whose completion did not go through (a BackendError) is handed back
(``retry``): the main thread starts its keeper thread, which retries while the lease lasts,
as for any settlement.  The completer never starts a thread of a keeper's nor counts an
outcome: ``Settlement.prune`` on the main thread does, once the keeper is done.

Threads: ``hand``, ``take_retries`` and ``stop`` on the main thread; ``_run`` on the completer
thread (started with the first hand-over, ended by ``stop``).
"""

from __future__ import annotations

import logging
import queue
import threading
from typing import Callable

from ..backends.base import Backend
from ..core.threads import start_thread
from .keeper import LeaseKeeper

log = logging.getLogger("jobq.worker")

STOP_WAIT = 15.0  # s ``stop`` waits for a batch still in flight (calls are bounded)


class Completer:
    """Completes handed-over keepers' leases in batches on a thread of its own."""

    def __init__(self, backend: Backend, wake: Callable[[], None] | None = None) -> None:
        """``wake``: called (completer thread) after each batch, so that the main loop looks
        at the settled keepers at once rather than at its next settling poll."""
        self.backend = backend
        self.wake = wake
        self._inbox: queue.SimpleQueue[list[LeaseKeeper] | None] = queue.SimpleQueue()
        self._retry: queue.SimpleQueue[LeaseKeeper] = queue.SimpleQueue()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- main thread -------------------------------------------------------------------
    def hand(self, keepers: list[LeaseKeeper]) -> None:
        """Complete ``keepers``' leases on the completer thread (main thread)."""
        if self._thread is None:
            self._thread = start_thread(self._run, "jobq-completer")
        self._inbox.put(keepers)

    def take_retries(self) -> list[LeaseKeeper]:
        """The keepers whose completion did not go through since the last call: their own
        thread must retry it (main thread)."""
        taken = []
        while True:
            try:
                taken.append(self._retry.get_nowait())
            except queue.Empty:
                return taken

    def stop(self) -> None:
        """End the thread once what was handed over is done (main thread, at exit)."""
        self._stop.set()
        self._inbox.put(None)
        if self._thread is not None:
            self._thread.join(STOP_WAIT)

    # -- completer thread --------------------------------------------------------------
    def _run(self) -> None:
        while True:
            first = self._inbox.get()
            batch: list[LeaseKeeper] = [] if first is None else list(first)
            while True:  # everything handed over meanwhile goes in the same call
                try:
                    more = self._inbox.get_nowait()
                except queue.Empty:
                    break
                if more is not None:
                    batch += more
            if batch:
                try:
                    self._complete(batch)
                except Exception:  # a bug here must not leave leases unsettled for good
                    log.exception("completer: %d leases handed back to their threads",
                                  len(batch))
                    for keeper in batch:
                        if not keeper.done.is_set():
                            self._retry.put(keeper)
                if self.wake is not None:
                    self.wake()
            if self._stop.is_set() and self._inbox.empty():
                return

    def _complete(self, batch: list[LeaseKeeper]) -> None:
        """One ``complete_many`` for ``batch`` (completer thread).  A keeper whose deadline
        passed meanwhile is not sent: its thread finds the lease lost."""
        ready = [k for k in batch if not k.lost()]
        try:
            errors = self.backend.complete_many([k.lease for k in ready]) if ready else []
        except Exception as exc:  # a backend's bug: every keeper's thread retries
            log.warning("completing %d leases together failed: %s", len(ready), exc,
                        exc_info=True)
            errors = [exc] * len(ready)
        outcome = dict(zip(map(id, ready), errors))
        for keeper in batch:
            if id(keeper) not in outcome or keeper.settled_together(outcome[id(keeper)]) is None:
                self._retry.put(keeper)
