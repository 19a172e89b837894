"""Spawner: a few threads that start task shells, so that one slow start does not hold up
the loop.

Starting a shell (worker/shell.py: glibc's posix_spawn through ctypes, which lets go of the GIL
while
the child execs) takes a millisecond or more on these machines: two spawner threads start tasks
faster than the main thread alone (measured 560 vs 457 tasks/s end to end). The main thread
still decides everything: it submits a prepared job and, when the job comes back on its event
queue, registers the process (lease, lifeline, watchdog); the job's ``after_spawn`` (the
launcher's) logs the start and hands the output pipe to the pump on the spawner thread, off the
main loop. Reaping stays on the main thread; it skips orphan reaping while a job is in flight,
so a just-forked shell that already exited is never mistaken for an orphan.

Like our other helper threads they block the supervisor's signals, so that SIGCHLD and SIGTERM
reach the main thread at once; the task itself starts with no signal blocked
(``TaskProcess.spawn`` clears the mask it would inherit).
"""

from __future__ import annotations

import logging
import queue
import threading
from dataclasses import dataclass, field
from typing import Callable, Generic, TypeVar

from ..core.file_modes import SpawnUmask
from ..core.threads import Flag, start_thread
from .process import SpawnOptions, TaskProcess

log = logging.getLogger("jobq.spawner")

C = TypeVar("C")


@dataclass(eq=False)
class SpawnJob(Generic[C]):
    """Everything the main thread prepared for one task; ``proc``/``error`` are the result.

    ``context`` is the submitter's own bookkeeping, carried through untouched (the launcher's
    is an ``events.TaskStart``: the lease, its keeper, the task, the attempts allowed)."""

    cmd: str
    env: dict[str, str]
    cwd: str | None
    marker: str
    context: C
    options: SpawnOptions = field(default_factory=SpawnOptions)  # TaskProcess.spawn keywords
    # Run on the spawner thread once the shell started (its output goes to the pump).
    after_spawn: Callable[[SpawnJob[C]], None] | None = None
    proc: TaskProcess | None = None
    error: OSError | ValueError | None = None
    # Set by the main thread when the worker stops: a job not yet forked is handed back
    # unforked (neither ``proc`` nor ``error``); one already forking runs its course.
    cancelled: bool = False
    done: Flag = field(default_factory=Flag)


class Spawner(Generic[C]):
    """``threads`` threads that run submitted jobs; ``on_done(job)`` runs on the spawner
    thread when one is done (the launcher's puts it on the main loop's queue)."""

    def __init__(self, threads: int, on_done: Callable[[SpawnJob[C]], None]) -> None:
        self._jobs: queue.SimpleQueue[SpawnJob[C] | None] = queue.SimpleQueue()
        self._on_done = on_done
        self._count = threads
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        self._threads = [start_thread(self._run, f"spawner-{i}") for i in range(self._count)]

    def submit(self, job: SpawnJob[C]) -> None:
        """Main thread."""
        self._jobs.put(job)

    def stop(self, timeout: float = 5.0) -> None:
        for _ in self._threads:
            self._jobs.put(None)
        for t in self._threads:
            t.join(timeout)

    def _run(self) -> None:
        """Spawner thread (started by ``start_thread``: our signals blocked): fork each job's
        shell, hand the result back.  The shell starts with the task's umask, not ours
        (core/file_modes.py): switched on this thread only."""
        umask = SpawnUmask()
        while True:
            job = self._jobs.get()
            if job is None:
                return
            if job.cancelled:
                job.done.set()
                self._on_done(job)
                continue
            try:
                with umask:
                    job.proc = TaskProcess.spawn(job.cmd, job.env, job.cwd, job.marker,
                                                 **job.options)
            except (OSError, ValueError) as exc:  # ValueError: a string the OS cannot take
                job.error = exc
            except Exception as exc:  # a bug here must not lose the job or kill the thread
                log.exception("spawning failed unexpectedly")
                job.error = OSError(str(exc))
            if job.proc is not None and job.after_spawn is not None:
                try:
                    job.after_spawn(job)
                except Exception:  # the main thread retries it when it registers the task
                    log.exception("setting up a started task failed unexpectedly")
            job.done.set()
            self._on_done(job)
