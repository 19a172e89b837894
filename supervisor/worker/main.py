"""The command line of ``jobq-supervisor`` (the worker); ``jobq-ctl``'s is ctl/main.py, which
takes this parser's options as its INI file's keys.

Every worker option is a long flag, a key of the same name in the ``--config`` INI file and an
environment variable ``JOBQ_<NAME>``; precedence: flag > environment > config file > default
(configargparse).  Errors are one line on stderr and exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import logging
import os
import queue
import sys
from collections.abc import Mapping
from functools import partial
from typing import NoReturn

from ..core.build import VersionAction
from ..core.options import (
    UsageError,
    _duration,
    _env_names,
    _exit_codes,
    _parse,
    _Parser,
    _paths,
    _positive_int,
    _size,
    _umask,
    add_backend_options,
    jobq_parser,
    usage_failed,
)
from ..core.settings import (
    EXIT_OK,
    EXIT_UNEXPECTED,
    EXIT_USAGE,
    LOCK_DEFAULTS,
    LOCK_LOST_BEHAVIORS,
    LOG_FORMATS,
    LOG_LEVELS,
    QUEUE_ORDERS,
    SCHEDULED_EVENTS_MODES,
    TASK_LIMITS,
    TASK_OUTPUT_MODES,
    Settings,
)

__all__ = ["UsageError", "parse_worker_settings", "reread_settings", "worker_main",
           "worker_parser"]

def _per_backend(index: int, otherwise: str) -> str:
    """``sqlite 2700, storage-queue 600 ...`` from LOCK_DEFAULTS, for help texts."""
    return ", ".join(f"{name} {value[index]:g}" if value[index] is not None
                     else f"{name} {otherwise}" for name, value in LOCK_DEFAULTS.items())


def _durations(p: argparse.ArgumentParser, *options: tuple[str, str]) -> None:
    """Options that take a duration (``30``, ``90s``, ``5m``, ``1h``): (flag, help) each."""
    for flag, text in options:
        p.add_argument(flag, type=_duration, help=text)


def worker_parser() -> _Parser:
    p = jobq_parser("jobq-supervisor", "Run shell tasks from a queue under renewed leases.",
                    ["-c", "--config"],
                    "INI config file; keys are the long option names; re-read on SIGUSR2 "
                    "(systemctl reload): a new log-level applies at once, the rest at the "
                    "next restart")
    p.add_argument("--version", action=VersionAction)
    p.add_argument("--check-config", action="store_true", cli_only=True,
                   help="check the configuration as a worker would at start (settings, keys, "
                        "task log directory, that this user may write the SQLite queue), print "
                        "one line and exit: 0 when it would start, 2 when not; opens no queue")
    add_backend_options(p)
    p.add_argument("-n", "--num-workers", type=int, help="tasks run at once")
    p.add_argument("--lock-duration", type=_duration,
                   help="lease length (default sqlite 2700s, storage-queue 600s, postgres "
                        "300s; servicebus: the queue's LockDuration when it can be read, else "
                        "this, default 60s)")
    p.add_argument("--visibility-timeout", dest="lock_duration", type=_duration,
                   default=argparse.SUPPRESS, help="alias of --lock-duration (Storage Queue)")
    p.add_argument("--renew-interval", type=_duration,
                   help=f"seconds between lease renewals ({_per_backend(1, 'lock/3')})")
    _durations(p,
               ("--renew-before", "renew at the latest this long before the lock ends"),
               ("--reaper-interval", "stale-lock reaper period (also of the purge of "
                "succeeded tasks; default sqlite 300s, postgres 10s); 0 disables both"),
               ("--retention", "SQLite, PostgreSQL: succeeded tasks older than this are "
                "purged (default 7d, as --task-output-retention; 0 keeps them for ever); "
                "failed and cancelled tasks are kept"),
               ("--stale-lock-age",
                "reap running jobs whose lock expired this long ago (default sqlite: "
                "the lock, postgres 0)"),
               ("--kill-timeout", "SIGTERM to SIGKILL escalation delay; 0 never escalates"))
    p.add_argument("--lock-lost-behavior", choices=LOCK_LOST_BEHAVIORS,
                   help="signal sent to a task whose lease is lost")
    p.add_argument("--max-attempts", type=int,
                   help="attempts per task before it is failed (a task may set its own)")
    p.add_argument("--no-retry-exit-codes", type=_exit_codes, metavar="N,N",
                   help="exit statuses that fail a task at once, not retried (default "
                        "126,127: bash's cannot execute, command not found; empty: retry "
                        "every status); a task that cannot start (missing --cwd) is never "
                        "retried either")
    _durations(p,
               ("--retry-delay", "first retry backoff; doubles per attempt"),
               ("--retry-delay-max", "upper bound of the retry backoff"),
               ("--task-time-limit", "SIGTERM a task running longer than this"),
               ("--time-limit", "worker lifetime: then requeue running tasks and exit 0"))
    p.add_argument("--max-consecutive-failures", type=_positive_int,
                   help="exit 3 after this many failed tasks in a row (0 = off)")
    p.add_argument("--exit-when-empty", action="store_true",
                   help="exit 0 once nothing is pending and nothing runs")
    _durations(p, ("--idle-timeout", "exit 0 after this long without a task"),
               ("--poll-interval", "seconds between receives while the queue is empty"))
    p.add_argument("--queue-order", choices=QUEUE_ORDERS,
                   help="with several --queue names: strict = a free slot takes from the first "
                        "queue that has work (default); round-robin = the queues take turns")
    p.add_argument("--task-log-dir", metavar="DIR", path=True,
                   help="also write each task's output to DIR/<task id>.<attempt>.log; such "
                        "files older than --task-output-retention are deleted (hourly; never "
                        "a running task's, never other names)")
    p.add_argument("--task-output", choices=TASK_OUTPUT_MODES,
                   help="task output: store = the output store (jobq-ctl logs) and the log; "
                        "local = the log only; off = neither; auto = store when there is one")
    p.add_argument("--task-log-buffer", type=_size,
                   help="bytes of output held per worker while the output store is slow or "
                        "down; beyond it output is dropped with a marker")
    p.add_argument("--task-output-max", type=_size,
                   help="bytes of output stored per attempt; the rest is cut with a marker")
    p.add_argument("--task-output-retention", type=_duration,
                   help="stored output and --task-log-dir files older than this are "
                        "purged (default 7d; must be positive)")
    p.add_argument("--worker-id", help="name of this worker in logs and task records "
                                       "(default when empty: HOST:PID:6 random hex digits)")
    p.add_argument("--lock-file", metavar="PATH", path=True,
                   help="hold an flock on PATH for the run; a second run exits 0 at once")
    p.add_argument("--metrics-file", metavar="PATH", path=True,
                   help="write Prometheus metrics to PATH (node_exporter textfile collector)")
    p.add_argument("--metrics-port", type=int, metavar="PORT",
                   help="also serve the metrics over HTTP at /metrics for Prometheus to scrape "
                        "(0: any free port, logged at start); off by default")
    p.add_argument("--metrics-address", metavar="ADDRESS",
                   help="the address --metrics-port listens on (0.0.0.0 or :: for every "
                        "interface)")
    _durations(p,
               ("--metrics-interval", "seconds between metrics file writes"),
               ("--heartbeat-interval",
                "seconds between updates of this worker's record in the control store"),
               ("--control-interval", "seconds between reads of cancels, pause flags and commands"))
    p.add_argument("--scheduled-events", choices=SCHEDULED_EVENTS_MODES,
                   help="poll Azure Scheduled Events for Preempt/Terminate (auto: on Azure VMs "
                        "unless JOBQ_DISABLE_SCHEDULED_EVENTS=1)")
    p.add_argument("--scheduled-events-url", metavar="URL",
                   help="Scheduled Events endpoint (Instance Metadata Service)")
    _durations(p, ("--scheduled-events-interval", "seconds between Scheduled Events polls"))
    p.add_argument("--scheduled-events-ack", action="store_true",
                   help="acknowledge a Preempt (StartRequests) once every task is requeued")
    _add_security_options(p)
    p.add_argument("--log-level", type=str.upper, choices=LOG_LEVELS,
                   help="log threshold (DEBUG shows every lease renewal)")
    p.add_argument("--log-format", choices=LOG_FORMATS,
                   help="text, or json: one object per line")
    return p


def _add_security_options(p: _Parser) -> None:
    """The worker's issue-7 options (worker/task_guard.py checks them at start)."""
    p.add_argument("--signing-key-file", action="append", metavar="PATH", path=True,
                   help="accept only tasks signed with this HMAC key (repeatable for key "
                        "rotation; env/INI: comma-separated list)")
    p.add_argument("--max-task-age", type=_duration,
                   help="refuse signed tasks issued longer ago than this")
    p.add_argument("--accept-queue-unbound-signatures", action="store_true",
                   help="while upgrading: also run tasks signed by an older jobq-ctl, whose "
                        "signature does not name the queue (docs/security.rst)")
    p.add_argument("--allowed-commands", metavar="REGEX",
                   help="refuse tasks whose command does not fully match REGEX")
    p.add_argument("--allowed-env", type=_env_names, metavar="NAME,NAME",
                   help="with an allow-list or signing keys: variables a message may set "
                        "although they change what runs (PATH, LD_*, PYTHON*...; shell "
                        "patterns allowed)")
    p.add_argument("--refused-env", type=_env_names, metavar="NAME,NAME",
                   help="more variable names (or patterns) a message may not set, with an "
                        "allow-list or signing keys")
    p.add_argument("--allowed-cwd", type=_paths, metavar="DIR,DIR",
                   help="with an allow-list or signing keys: working directories a message "
                        "may ask for (shell patterns allowed; default: the worker's own)")
    p.add_argument("--pass-env", type=_env_names, metavar="NAME,NAME",
                   help="inherited variables a task sees although their names look like "
                        "secrets (docs/security.rst lists the words), e.g. HF_TOKEN")
    p.add_argument("--task-umask", type=_umask, metavar="OCTAL",
                   help="the umask a task's shell starts with (default: the one the worker "
                        "was started with; the worker's own files are 0600/0700)")
    p.add_argument("--task-user", metavar="NAME",
                   help="run tasks as this user (the supervisor must run as root)")
    p.add_argument("--task-group", metavar="NAME",
                   help="run tasks with this group (default: the task user's group)")
    p.add_argument("--task-memory-limit", type=_size, metavar="SIZE",
                   help="memory limit per task, e.g. 512M, 2G (systemd: MemoryMax of the "
                        "task's scope; rlimit: address space per process)")
    p.add_argument("--task-cpu-limit", type=_duration, metavar="SECONDS",
                   help="CPU-time limit per task process (RLIMIT_CPU, both mechanisms)")
    p.add_argument("--task-max-procs", type=_positive_int, metavar="N",
                   help="process limit (systemd: TasksMax of the task's scope; rlimit: "
                        "RLIMIT_NPROC of the task user, not for root)")
    p.add_argument("--task-limits", choices=TASK_LIMITS,
                   help="how the task limits are applied: systemd scopes (cgroups), rlimits, "
                        "or auto: systemd when it can create scopes, else rlimits")


def parse_worker(argv: list[str], env: Mapping[str, str] | None = None,
                 worker_id: str = "") -> tuple[Settings, bool]:
    """The settings of ``argv`` and ``env`` (default: this process's environment) and the
    config file they name, and whether ``--check-config`` was given (main thread).  Raises
    UsageError.  ``worker_id``: the id when the options leave it empty (a reload keeps the
    one made at start), else a new random one."""
    parser = worker_parser()
    ns = _parse(parser, argv, env)
    ns.worker_id = ns.worker_id or worker_id
    return parser.settings(ns), bool(ns.check_config)


def parse_worker_settings(argv: list[str]) -> Settings:
    return parse_worker(argv)[0]


def reread_settings(argv: list[str], env: Mapping[str, str], worker_id: str) -> Settings:
    """The start's command line and environment parsed again, with the config file as it is
    now: a reload (worker/reload.py; main thread).  Raises UsageError as a start would."""
    return parse_worker(argv, env, worker_id)[0]


def _fail_usage(prog: str, message: str) -> int:
    """The one-line error of exit status 2: with ``--log-format json`` (once the settings are
    read and the log is set up) a JSON log record, as every other line of the stream."""
    from .logs import json_logging

    if prog == "jobq-supervisor" and json_logging():
        logging.getLogger("jobq").error("%s: error: %s", prog, message,
                                        extra={"exit_status": EXIT_USAGE})
        return EXIT_USAGE
    return usage_failed(prog, message)


SWITCH_INTERVAL = 0.0002


def worker_entry() -> NoReturn:
    """The ``jobq-supervisor`` command (main thread): ``worker_main``, then the process ends
    at once.  By then every thread of ours that matters was joined or stopped (the rest are
    daemons, which a normal exit does not wait for either) and the log is written; what a
    normal exit adds is the interpreter's teardown of the SDKs' module graph -- 50-90 ms of
    every batch run (exit on an empty Azurite queue 0.53 -> 0.45 s).

    First of all, before any thread or file: the credentials go from ``ps``'s view of our
    command line, and what we create from here on is private (core/file_modes.py)."""
    from ..core import file_modes
    from ..core.argv_secrets import wipe_argv_secrets
    from .logs import stop_logging

    wipe_argv_secrets()
    file_modes.restrict()
    code = worker_main()
    stop_logging()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(code)


def worker_main(argv: list[str] | None = None) -> int:
    """The worker, in-process (main thread); ``worker_entry`` is the command."""
    from ..backends.base import BackendConfigError
    from .logs import setup_logging
    from .loop import Worker

    argv = sys.argv[1:] if argv is None else argv
    env = dict(os.environ)  # what a reload parses again, whatever changes os.environ later
    try:
        settings, check_only = parse_worker(argv)
    except UsageError as exc:
        return _fail_usage("jobq-supervisor", str(exc))  # the log format is not known yet
    from ..core import file_modes

    file_modes.configure(settings.group_readable, settings.task_umask)
    setup_logging(settings.log_level, settings.log_format)
    from ..core.signing import SecurityConfigError
    from .task_guard import TaskGuard

    try:
        guard = TaskGuard.from_settings(settings)
    except SecurityConfigError as exc:
        return _fail_usage("jobq-supervisor", str(exc))
    from .startup import check_task_output, make_task_log_dir, open_with_retry

    problem = make_task_log_dir(settings) or check_task_output(settings)
    if problem:
        return _fail_usage("jobq-supervisor", problem)
    if check_only:
        from .config_check import backend_problem, summary

        problem = backend_problem(settings)
        if problem:
            return _fail_usage("jobq-supervisor", problem)
        print(summary(settings))
        return EXIT_OK
    if settings.lock_file:
        from .lockfile import AlreadyRunning, acquire

        try:
            acquire(settings.lock_file)  # held until the process exits
        except AlreadyRunning:
            logging.getLogger("jobq").info("another run holds %s; exiting",
                                           settings.lock_file)
            return EXIT_OK
        except OSError as exc:
            return _fail_usage("jobq-supervisor",
                               f"--lock-file: cannot open {settings.lock_file}: {exc.strerror}")
    from .preemption import SignalQueue

    # From here on no signal of the table (core/signals.py) ends the worker unseen: start-up and
    # then the worker's main loop read this queue; Worker.run restores the handlers.
    signals = SignalQueue(queue.SimpleQueue())
    signals.install()
    try:
        backend = open_with_retry(settings, signals)
    except BackendConfigError as exc:
        signals.restore()
        return _fail_usage("jobq-supervisor", str(exc))
    if backend is None:  # stopped by a signal while the backend was unreachable
        signals.restore()
        return EXIT_OK
    from .metrics import MetricsUnavailable

    try:
        worker = Worker(settings, backend, guard=guard, signals=signals,
                        reread=partial(reread_settings, list(argv), env))
    except MetricsUnavailable as exc:
        signals.restore()
        backend.close()
        return _fail_usage("jobq-supervisor", str(exc))
    # Every task passes through several threads (main loop, spawner, output pump, lease
    # keeper), each handing over the GIL; a thread woken by an event waits for the GIL up to
    # the switch interval while another runs Python.  0.2 ms instead of the default 5 ms:
    # measured +10 % tasks/s on short tasks at 0.5 ms, +7 % more at 0.2 ms (0.1 ms: no
    # further gain), and no CPU-bound thread here to lose by it.
    sys.setswitchinterval(SWITCH_INTERVAL)
    try:
        return worker.run()
    except BackendConfigError as exc:
        return _fail_usage("jobq-supervisor", str(exc))
    except Exception:
        logging.getLogger("jobq").exception("unexpected error; exiting")
        return EXIT_UNEXPECTED
    finally:
        backend.close()
