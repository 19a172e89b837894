"""Start daemon threads that never take the supervisor's signals.

Linux delivers a process-directed signal to any thread that does not block it; Python runs
handlers on the main thread only, but a signal that lands on a worker thread wakes the main
thread late.  Blocking our signals in every helper thread sends them to the main thread,
where the handler enqueues them at once.
"""

from __future__ import annotations

import _thread
import contextlib
import logging
import os
import queue
import signal
import sys
import threading
from collections.abc import Iterator
from typing import Callable

from .signals import CAUGHT_SIGNALS

HANDLED_SIGNALS = CAUGHT_SIGNALS  # every signal the worker catches (core/signals.py)
# Nice increment of a bulk thread (``start_thread(bulk=True)``): the threads that move task
# output (the pump, the log writer, the output-store thread) yield a core to the lease
# keepers, the watchdog and the main loop.  Beside a 150 MB flood on 2 cores the renewals'
# p50 went from 6 to 3 ms and their p99 from 76 to 16 ms (docs/benchmarks.rst); a task
# printing faster than a niced pump reads waits on its pipe, which is all the backpressure a
# flood needs.
BULK_NICE = 10


def start_thread(target: Callable[[], None], name: str, *,
                 bulk: bool = False) -> threading.Thread:
    """Start ``target`` on a daemon thread with the supervisor's signals blocked (any thread);
    a ``bulk`` one also runs ``BULK_NICE`` steps nicer than the process."""

    def run() -> None:
        signal.pthread_sigmask(signal.SIG_BLOCK, HANDLED_SIGNALS)
        if bulk:
            lower_priority()
        target()

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    return thread


@contextlib.contextmanager
def signals_blocked() -> Iterator[None]:
    """The supervisor's signals blocked on this thread for the block (any thread): a thread a
    library starts in it (psycopg_pool's workers, at ``open``) inherits the mask, so that a
    signal never lands there.  One that arrives meanwhile stays pending until the block ends."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, HANDLED_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def start_fast(target: Callable[[], None]) -> None:
    """Run ``target`` on a thread of its own, reusing an idle one when there is (main thread).

    The thread runs nothing else until ``target`` returns.  ``threading.Thread.start`` blocks
    until the new thread runs, and creating a thread at all (``pthread_create``, with the GIL
    held) was a good part of a short task's cost to the supervisor: a finished lease keeper's
    thread waits ``POOL_IDLE`` seconds for the next lease instead.  Lease keepers signal their
    own end through an Event, so they need no Thread object to join.
    """
    try:
        _idle.pop().put(target)  # that thread is waiting in _pooled, on its own queue
    except IndexError:
        _thread.start_new_thread(_pooled, (target,))


POOL_IDLE = 30.0  # an idle pooled thread ends after this long without work
_idle: list[queue.SimpleQueue[Callable[[], None]]] = []  # list.append/pop are atomic


def _pooled(target: Callable[[], None]) -> None:
    """A pooled thread: run a target, then offer itself for the next one (pooled thread)."""
    signal.pthread_sigmask(signal.SIG_BLOCK, HANDLED_SIGNALS)
    inbox: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
    while True:
        try:
            target()
        except Exception:  # the target's own failure must not end a reusable thread unseen
            logging.getLogger("jobq").exception("unexpected error on a pooled thread")
        _idle.append(inbox)
        try:
            target = inbox.get(timeout=POOL_IDLE)
        except queue.Empty:
            try:
                _idle.remove(inbox)
            except ValueError:  # start_fast took it just now: its target is on the way
                target = inbox.get()
                continue
            return


class Flag:
    """A one-shot ``threading.Event`` (set once, never cleared) on a single C lock (any thread).

    Every task carries several such flags (lease lost, keeper done, output closed, tree clean);
    ``threading.Event`` builds a Condition with Python-level waiter lists for each, and its
    construction and ``set`` were ~10 % of the supervisor's time per short task.  Here the
    lock is held while the flag is clear; ``set`` releases it and a waiter passes through.
    """

    __slots__ = ("_set", "_gate")

    def __init__(self) -> None:
        self._set = False
        self._gate = _thread.allocate_lock()
        self._gate.acquire()

    def is_set(self) -> bool:
        return self._set

    def set(self) -> None:
        if not self._set:
            self._set = True
            self._open()

    def wait(self, timeout: float | None = None) -> bool:
        if self._set:
            return True
        if self._gate.acquire(timeout=-1 if timeout is None else max(0.0, timeout)):
            self._open()  # let the next waiter through too
        return self._set

    def _open(self) -> None:
        try:
            self._gate.release()
        except RuntimeError:  # a concurrent set() or waiter released it already: open anyway
            pass


def lower_priority() -> None:
    """This thread alone ``BULK_NICE`` steps nicer, at most 19 (the calling thread).  Linux
    only: there a thread id names one thread to setpriority; elsewhere the same call would
    renice the whole process, so nothing is done.  Raising one's own nice value needs no
    privilege; a refusal (a seccomp filter) leaves the thread as it was."""
    if not sys.platform.startswith("linux"):
        return
    tid = threading.get_native_id()
    with contextlib.suppress(OSError):
        os.setpriority(os.PRIO_PROCESS, tid,
                       min(19, os.getpriority(os.PRIO_PROCESS, tid) + BULK_NICE))
