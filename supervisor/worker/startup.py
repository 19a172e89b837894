"""What runs before the worker's main loop: the task log directory, ``--task-output store``
checked, and the backend opened with retry while it is unreachable (a stop signal meanwhile
is a stop like any other; core/signals.py's table applies).

Main thread only, called by ``cli.worker_main``.
"""

from __future__ import annotations

import logging
import os
import queue
import signal
import time

from ..backends import open_backend
from ..backends.base import Backend, BackendError
from ..core.backoff import Outage
from ..core.settings import EXIT_OK, Settings
from ..core.signals import DRAIN_SIGNAL, STOP_ONCE_SIGNALS, STOP_SIGNALS, on_other_signal
from ..core.signals import name as signal_name
from .preemption import SignalQueue
from .reporting import ZERO_COUNTS, log_summary

ENDING_SIGNALS = (*STOP_SIGNALS, *STOP_ONCE_SIGNALS, DRAIN_SIGNAL)  # before a task ran: a stop
OPEN_RETRY_MAX = 30.0  # s: the longest pause between two tries to open the backend
NOT_REACHABLE = ("backend not reachable (attempt %(failures)d): %(error)s; "
                 "retrying in %(backoff).0fs")


def make_task_log_dir(settings: Settings) -> str | None:
    """Create ``--task-log-dir`` if missing; the one-line error if it cannot be (main thread).

    Now, not per task: a task's log file is opened on a spawner thread, where a missing
    directory was only a WARNING per task and no file ever written."""
    if not settings.task_log_dir:
        return None
    try:
        os.makedirs(settings.task_log_dir, exist_ok=True)
    except OSError as exc:
        return f"--task-log-dir: cannot create {settings.task_log_dir}: {exc.strerror or exc}"
    return None


def check_task_output(settings: Settings) -> str | None:
    """``--task-output store`` without an output store for this queue: the one-line error
    (main thread).  Nothing is created and no call made (``create=False``); ``auto`` is
    resolved by ``OutputShipper.for_worker`` the same way."""
    if settings.task_output != "store":
        return None
    from ..fleet.output.base import OutputConfigError
    from ..fleet.output.open import open_output_store

    try:
        store = open_output_store(settings, create=False)
    except OutputConfigError as exc:
        return f"--task-output store: {exc}"
    if store is None:
        return ("--task-output store: this queue has no output store (it lives beside the "
                "control store: not with --control off; on Azure it needs the control "
                "storage account)")
    store.close()
    return None


def open_with_retry(settings: Settings, signals: SignalQueue) -> Backend | None:
    """Open the backend; a transient outage is retried with back-off (core/backoff.py: from
    1 s doubling to OPEN_RETRY_MAX), one log line per try.

    ``signals`` is installed already (its handlers only enqueue): a stop or a drain meanwhile
    (no task runs yet) is a stop like any other -- the summary line, then None (exit 0); the
    other signals of the table (core/signals.py) do what they do in the main loop (SIGQUIT: the
    stacks; SIGUSR2 and the like: a log line).  What arrives once the backend is open stays
    on the queue for the worker's main loop."""
    log = logging.getLogger("jobq")
    started = time.monotonic()
    # Every try logged (log_every 0), no recovery line: the worker's start says it.
    outage = Outage("backend", log, time.monotonic, backoff_max=OPEN_RETRY_MAX, log_every=0.0,
                    repeat=True, warning=NOT_REACHABLE, recovery=None)
    while True:
        delay = 0.0
        try:
            backend = open_backend(settings)
        except BackendError as exc:
            delay = outage.failed("open", exc)
            backend = None
        signum = _wait_for_stop(signals, delay, log)
        if signum is None:
            if backend is not None:
                return backend
            continue
        if backend is not None:
            backend.close()
        log_summary(ZERO_COUNTS, time.monotonic() - started,
                    f"{signal_name(signum)} received", EXIT_OK)
        return None


def _wait_for_stop(signals: SignalQueue, timeout: float, log: logging.Logger) -> int | None:
    """The first stop (or drain) signal within ``timeout``, or None; the others are handled
    as they come (main thread).  Only signal numbers are on the queue before the worker."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            signum = signals.events.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            return None
        if not isinstance(signum, int) or signum == signal.SIGCHLD:
            continue  # no child of ours yet
        ignored = signum in signals.inherited_ignored
        if signum in ENDING_SIGNALS and not ignored:
            return signum
        on_other_signal(signum, ignored, log)
