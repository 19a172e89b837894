"""What jobq-supervisor does with each signal whose default action would end it.

The table (docs/reliability.rst, "Signals to the worker") in one place, stdlib only: the
signal queue (worker/preemption.py) installs handlers for these, helper threads block them
(core/threads.py), a task's shell gets them back at their defaults (worker/shell.py), and the
lifeline
helper ignores them (worker/lifeline.py).  Handlers only enqueue the number; the main loop calls
``on_other_signal`` for everything that is not a stop, a drain or (once it runs) a reload.
"""

from __future__ import annotations

import signal
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the lifeline helper imports this module: it starts on the stdlib's core
    import logging


def _signals(*names: str) -> tuple[signal.Signals, ...]:
    return tuple(getattr(signal, n) for n in names if hasattr(signal, n))


# Graceful stop (tasks requeued, summary line, exit 0); a second one kills the tasks at once.
# SIGHUP: the terminal of a foreground worker closed (an SSH session ended) -- a stop, not a
# reload; a worker started with SIGHUP ignored (nohup) keeps ignoring it.
STOP_SIGNALS = _signals("SIGTERM", "SIGINT", "SIGHUP")
# Also a graceful stop, but never "the second signal": the kernel repeats SIGXCPU every CPU
# second past the worker's soft RLIMIT_CPU, until SIGKILL at the hard limit.
STOP_ONCE_SIGNALS = _signals("SIGXCPU")
DRAIN_SIGNAL = signal.SIGUSR1  # no new tasks, running ones finish, exit 0
# ``systemctl reload``: re-read the configuration (worker/reload.py); never a stop or a drain,
# so that a generic reload (configuration management, logrotate) cannot take a fleet down.
RELOAD_SIGNAL = signal.SIGUSR2
DUMP_SIGNAL = signal.SIGQUIT  # every thread's stack to the log; the worker goes on
# Meaningless to a worker, each would kill it by default: one log line, nothing else.
# SIGPWR is init's (the shutdown that follows sends SIGTERM); real-time signals have no
# fixed meaning.
IGNORED_SIGNALS = (*_signals("SIGALRM", "SIGVTALRM", "SIGPROF", "SIGPOLL",
                             "SIGPWR", "SIGSTKFLT"),
                   *range(signal.SIGRTMIN, signal.SIGRTMAX + 1))
# Started under nohup, the worker inherits SIGHUP ignored, and keeps it so (logged).
INHERITED_IGNORED = _signals("SIGHUP")
# Every signal the worker catches: helper threads block them, a task gets them at default.
CAUGHT_SIGNALS = frozenset({*STOP_SIGNALS, *STOP_ONCE_SIGNALS, DRAIN_SIGNAL, RELOAD_SIGNAL,
                            DUMP_SIGNAL, *IGNORED_SIGNALS, signal.SIGCHLD})
# Ignored by Python itself (SIG_IGN, which survives exec): a task gets them back at default.
PYTHON_IGNORED = _signals("SIGPIPE", "SIGXFSZ")


def name(signum: int) -> str:
    """``SIGHUP``, ``SIGRTMIN+3`` (any thread)."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"SIGRTMIN+{signum - signal.SIGRTMIN}"


def describe_exit(returncode: int) -> str:
    """How a shell ended as its Popen returncode says it: ``exit status 3``, ``killed by
    SIGTERM`` (-15) -- the worker's log line and the dashboard's words (any thread)."""
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"killed by {name}"
    return f"exit status {returncode}"


def on_other_signal(signum: int, inherited_ignored: bool, log: logging.Logger) -> None:
    """A caught signal that is neither a stop nor a drain, from the signal queue (main
    thread): SIGQUIT dumps the threads, anything else is logged and ignored -- SIGUSR2 only
    here while the worker starts (its main loop reloads: worker/reload.py)."""
    if signum == DUMP_SIGNAL:
        log.warning("SIGQUIT received: stacks of every thread follow; the worker goes on\n%s",
                    thread_stacks(), extra={"multiline": True})
    elif signum == RELOAD_SIGNAL and not inherited_ignored:
        log.warning("SIGUSR2 received: ignored (the worker is still starting, with the "
                    "configuration it just read; a reload re-reads it once the worker runs)")
    elif inherited_ignored:
        log.info("%s received: ignored (the worker was started with it ignored, e.g. under "
                 "nohup)", name(signum))
    else:
        log.warning("%s received: ignored (it means nothing to jobq-supervisor; SIGTERM "
                    "stops, SIGUSR1 drains, SIGUSR2 reloads)", name(signum))


def thread_stacks() -> str:
    """Every thread's current stack, the way a traceback prints it (main thread)."""
    import threading
    import traceback

    names = {t.ident: t.name for t in threading.enumerate()}
    parts = []
    for ident, frame in sys._current_frames().items():
        stack = "".join(traceback.format_stack(frame))
        parts.append(f"Thread {names.get(ident, '?')} ({ident}):\n{stack}")
    return "\n".join(parts).rstrip("\n")
