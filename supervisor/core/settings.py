"""Settings: the worker's configuration as one frozen value, with defaults and validation.

``worker/main.py`` parses flags/environment/config file into a Namespace;
``Settings.from_namespace``
turns it into this value and raises SettingsError -- one clear line naming the option -- for
anything that cannot work.  Everything after start-up reads Settings, never argv or os.environ.
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import uuid
from dataclasses import dataclass, fields

# Exit statuses of jobq-supervisor (docs/troubleshooting.rst, "Exit statuses"): one table for
# worker/main.py and worker/loop.py.
EXIT_OK, EXIT_UNEXPECTED, EXIT_USAGE, EXIT_FAILURES, EXIT_TASKS_FAILED = 0, 1, 2, 3, 4

BACKENDS = ("sqlite", "storage-queue", "servicebus", "postgres")
# The backends whose service bills (and throttles) per call: the Azure ones; an open
# dashboard page refreshes less often on them (dashboard/serve.py).
BILLED_PER_CALL = ("storage-queue", "servicebus")
# --postgres-notify: LISTEN/NOTIFY wake-ups, or poll only (PgBouncer in transaction mode)
POSTGRES_NOTIFY_MODES = ("on", "off")
# --postgres-schema: a plain lower-case SQL identifier, the same quoted or not (pg_* are
# the server's own)
POSTGRES_SCHEMA_NAME = re.compile(r"(?!pg_)[a-z_][a-z0-9_]{0,62}")
# The longest queue name: Storage Queue's limit, kept by every backend alike
QUEUE_NAME_MAX = 63
# How a worker's several queues take turns (backends/multi.py)
QUEUE_ORDERS = ("strict", "round-robin")
LOCK_LOST_BEHAVIORS = ("sigkill", "sigterm")
LOG_FORMATS = ("text", "json")
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
SCHEDULED_EVENTS_MODES = ("auto", "on", "off")
TASK_LIMITS = ("auto", "systemd", "rlimit")  # how task limits are applied (worker/limits.py)
CONTROL_MODES = ("auto", "off")  # the fleet control store (fleet/control/open.py)
# Where task output goes (fleet/output/): auto = store when an output store exists, else local.
TASK_OUTPUT_MODES = ("auto", "store", "local", "off")
# The Instance Metadata Service's Scheduled Events endpoint (worker/preemption.py polls it).
SCHEDULED_EVENTS_URL = "http://169.254.169.254/metadata/scheduledevents?api-version=2020-07-01"

# Per-backend defaults for the lease: (lock duration, renew interval or None = lock/3).
LOCK_DEFAULTS: dict[str, tuple[float, float | None]] = {
    "sqlite": (2700.0, 120.0),
    "storage-queue": (600.0, None),
    "servicebus": (60.0, None),
    # outlives a managed server's failover (a minute or two) with renewals every 100 s
    "postgres": (300.0, None),
}

# Per-backend defaults of the stale-lock reaper: (--reaper-interval, --stale-lock-age or None
# = the lock duration).  PostgreSQL: a dead host's lease comes back within ~10 s of its
# lock's end (backends/postgres/reaper.py); the others: a pass every 5 minutes, a lock
# expired by its own length.
REAPER_DEFAULTS: dict[str, tuple[float, float | None]] = {"postgres": (10.0, 0.0)}
REAPER_DEFAULT: tuple[float, float | None] = (300.0, None)

_DURATION = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([smhd]?)\s*$", re.IGNORECASE)
_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


class SettingsError(ValueError):
    """A configuration value that cannot work; the message names the option (``option``:
    its long name without dashes, when there is one; ``problem``: the rest)."""

    def __init__(self, message: str, option: str | None = None,
                 problem: str | None = None) -> None:
        super().__init__(message)
        self.option = option
        self.problem = problem if problem is not None else message


def parse_duration(text: str) -> float:
    """``45``, ``45s``, ``10m``, ``2h``, ``1d``, ``0.5`` -> seconds.  Raises ValueError."""
    match = _DURATION.match(str(text))
    if not match:
        raise ValueError(f"invalid duration {text!r} (use e.g. 45, 45s, 10m, 2h, 1d)")
    return float(match.group(1)) * _UNITS[match.group(2).lower()]


def format_duration(seconds: float) -> str:
    """``7d``, ``36h``, ``90m``, ``45s``: the inverse of parse_duration, for messages."""
    for unit, size in (("d", 86_400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g}{unit}"
    return f"{seconds:g}s"


def safety_margin(lock: float) -> float:
    """The lease deadline's margin: max(2 s, 10 % of the lock), capped at lock/3."""
    return min(max(2.0, 0.1 * lock), lock / 3.0)


def default_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


@dataclass(frozen=True)
class Settings:
    backend: str = "sqlite"
    queue: str = "default"  # a worker's may be a comma-separated list (``queues``)
    queue_order: str = "strict"  # one of QUEUE_ORDERS: how a worker's queues take turns
    sqlite_path: str = "jobq.db"
    connection_string: str | None = None
    account_url: str | None = None
    namespace: str | None = None
    # PostgreSQL (backends/postgres/): a libpq connection string, URI or key=value (None or
    # empty: libpq's PG* environment variables and ~/.pgpass)
    postgres_url: str | None = None
    postgres_schema: str = "jobq"
    postgres_notify: str = "on"  # one of POSTGRES_NOTIFY_MODES
    num_workers: int = 1
    lock_duration: float | None = None  # None: the backend's default
    renew_interval: float | None = None  # None: the backend's default
    renew_before: float = 10.0
    reaper_interval: float | None = None  # None: the backend's (REAPER_DEFAULTS)
    retention: float = 7 * 86_400.0  # s a succeeded task stays in the SQLite queue; 0: for ever
    stale_lock_age: float | None = None  # None: the backend's (REAPER_DEFAULTS)
    kill_timeout: float = 600.0
    lock_lost_behavior: str = "sigkill"
    max_attempts: int = 5
    # exit statuses of a task that are final at once, never retried (worker/settlement.py); bash's
    # own "cannot execute" and "command not found" by default
    no_retry_exit_codes: tuple[int, ...] = (126, 127)
    # inherited variables a task sees although their names look like secrets (core/secret_names.py)
    pass_env: tuple[str, ...] = ()
    retry_delay: float = 10.0
    retry_delay_max: float = 600.0
    task_time_limit: float | None = None
    time_limit: float | None = None
    max_consecutive_failures: int = 0
    exit_when_empty: bool = False
    idle_timeout: float | None = None
    poll_interval: float = 1.0
    task_log_dir: str | None = None
    lock_file: str | None = None
    metrics_file: str | None = None
    metrics_interval: float = 5.0
    metrics_port: int | None = None  # serve the metrics over HTTP (worker/metrics_server.py)
    metrics_address: str = "127.0.0.1"  # loopback: a scraper elsewhere is an explicit choice
    scheduled_events: str = "auto"
    scheduled_events_url: str = SCHEDULED_EVENTS_URL
    scheduled_events_interval: float = 1.0
    scheduled_events_ack: bool = False
    log_level: str = "INFO"
    log_format: str = "text"
    worker_id: str = ""
    # security (see worker/task_guard.py; checked there, at start, by TaskGuard.from_settings)
    signing_key_file: list[str] | None = None  # paths, each maybe a comma-separated list
    max_task_age: float | None = None
    accept_queue_unbound_signatures: bool = False  # an upgrade's window (core/signing.py)
    allowed_commands: str | None = None
    # with an allow-list or signing keys: what a message's env and cwd may set (env_policy.py)
    allowed_env: tuple[str, ...] = ()
    refused_env: tuple[str, ...] = ()
    allowed_cwd: tuple[str, ...] = ()
    task_user: str | None = None
    task_group: str | None = None
    task_memory_limit: int | None = None  # bytes
    task_cpu_limit: float | None = None  # CPU seconds
    task_max_procs: int | None = None
    task_limits: str = "auto"  # one of TASK_LIMITS
    config_file: str | None = None  # the --config file, for the world-readable warning
    # the modes of what we create (core/file_modes.py): 0600/0700, or 0640/0750 with this
    group_readable: bool = False
    task_umask: int | None = None  # None: the umask the command was started with
    # fleet control (fleet/control/open.py; the control thread)
    control: str = "auto"  # one of CONTROL_MODES
    control_account_url: str | None = None
    control_connection_string: str | None = None
    heartbeat_interval: float = 15.0
    control_interval: float = 5.0
    # task output (fleet/output/): the output store beside the control store
    task_output: str = "auto"  # one of TASK_OUTPUT_MODES
    task_log_container: str = "jobq-logs"  # Azure: the blob container
    task_log_buffer: int = 64 << 20  # bytes held for the store per worker, then dropped
    task_output_max: int = 100 << 20  # bytes stored per attempt, then a truncation marker
    task_output_retention: float = 7 * 86_400.0  # s: older output is purged

    def __repr__(self) -> str:
        shown = {f.name: getattr(self, f.name) for f in fields(self)}
        for secret in ("connection_string", "control_connection_string", "postgres_url"):
            if shown.get(secret):
                shown[secret] = "<redacted>"
        return "Settings(" + ", ".join(f"{k}={v!r}" for k, v in shown.items()) + ")"

    # -- derived values -------------------------------------------------------------------
    @property
    def lock(self) -> float:
        return self.lock_duration if self.lock_duration is not None else LOCK_DEFAULTS[
            self.backend][0]

    @property
    def renew_every(self) -> float:
        """Seconds between renewals: the flag, else the backend default, else lock/3, never
        later than lock - renew_before (when that is positive)."""
        if self.renew_interval is not None:
            return self.renew_interval
        default = LOCK_DEFAULTS[self.backend][1]
        lock = self.lock
        interval = default if default is not None and default < lock / 2 else lock / 3.0
        if lock - self.renew_before > 0:
            interval = min(interval, lock - self.renew_before)
        return interval

    @property
    def queues(self) -> tuple[str, ...]:
        """The queue names in ``--queue`` order (one, unless a comma-separated list)."""
        return tuple(name.strip() for name in self.queue.split(","))

    @property
    def stale_age(self) -> float:
        if self.stale_lock_age is not None:
            return self.stale_lock_age
        default = REAPER_DEFAULTS.get(self.backend, REAPER_DEFAULT)[1]
        return default if default is not None else self.lock

    @property
    def reaper_every(self) -> float:
        """Seconds between stale-lock reaper passes (0: none): the flag, else the backend's
        default."""
        if self.reaper_interval is not None:
            return self.reaper_interval
        return REAPER_DEFAULTS.get(self.backend, REAPER_DEFAULT)[0]

    @classmethod
    def from_namespace(cls, ns: argparse.Namespace) -> Settings:
        values = {f.name: getattr(ns, f.name) for f in fields(cls) if hasattr(ns, f.name)}
        if not values.get("worker_id"):
            values["worker_id"] = default_worker_id()
        settings = cls(**values)
        settings.validate()
        return settings

    def validate(self) -> None:
        def bad(option: str, problem: str) -> SettingsError:
            return SettingsError(f"--{option}: {problem}", option, problem)

        if self.backend not in BACKENDS:
            raise bad("backend", f"unknown backend {self.backend!r} (choose {', '.join(BACKENDS)})")
        names = self.queues
        for i, name in enumerate(names):
            if not name:
                raise bad("queue", f"empty queue name in {self.queue!r}")
            if name in names[:i]:
                raise bad("queue", f"queue {name!r} named twice in {self.queue!r}")
            if len(name) > QUEUE_NAME_MAX:
                raise bad("queue", f"queue name {name[:20] + '...'!r} is {len(name)} "
                          f"characters long: at most {QUEUE_NAME_MAX}")
            if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name):
                raise bad("queue", f"invalid queue name {name!r} (letters, digits, . _ -, "
                          f"starting with a letter or digit; at most {QUEUE_NAME_MAX} "
                          "characters)")
        if self.queue_order not in QUEUE_ORDERS:
            raise bad("queue-order", f"must be one of {', '.join(QUEUE_ORDERS)}")
        if self.backend == "storage-queue" and bool(self.connection_string) == bool(
                self.account_url):
            raise bad("connection-string", "storage-queue needs exactly one of "
                      "--connection-string (or JOBQ_CONNECTION_STRING) and --account-url")
        if self.backend == "servicebus" and bool(self.connection_string) == bool(
                self.namespace):
            raise bad("connection-string", "servicebus needs exactly one of "
                      "--connection-string (or JOBQ_CONNECTION_STRING) and --namespace")
        if not POSTGRES_SCHEMA_NAME.fullmatch(self.postgres_schema):
            raise bad("postgres-schema", f"invalid schema name {self.postgres_schema!r} "
                      "(lower-case letters, digits and _, not starting with a digit or pg_, "
                      "at most 63)")
        if self.postgres_notify not in POSTGRES_NOTIFY_MODES:
            raise bad("postgres-notify", "must be on or off")
        if self.num_workers < 1:
            raise bad("num-workers", "must be at least 1")
        if self.lock_duration is not None and self.lock_duration <= 0:
            raise bad("lock-duration", "must be positive")
        if self.backend == "storage-queue" and not 1 <= self.lock <= 604800:
            raise bad("lock-duration", "Storage Queue visibility must be 1..604800 seconds")
        if self.renew_interval is not None and self.renew_interval <= 0:
            raise bad("renew-interval", "must be positive")
        lock = self.lock
        if self.renew_every >= lock - safety_margin(lock):
            raise bad(
                "renew-interval",
                f"{self.renew_every:g}s leaves no time to renew a {lock:g}s lock "
                f"(must be under {lock - safety_margin(lock):g}s = lock minus safety margin)",
            )
        for name in ("reaper_interval", "retention", "kill_timeout", "retry_delay",
                     "retry_delay_max", "renew_before"):
            if (getattr(self, name) or 0) < 0:
                raise bad(name.replace("_", "-"), "must not be negative")
        if self.stale_lock_age is not None and self.stale_lock_age < 0:
            raise bad("stale-lock-age", "must not be negative")
        if self.lock_lost_behavior not in LOCK_LOST_BEHAVIORS:
            raise bad("lock-lost-behavior", "must be sigkill or sigterm")
        if self.max_attempts < 1:
            raise bad("max-attempts", "must be at least 1")
        for code in self.no_retry_exit_codes:
            if not 1 <= code <= 255:
                raise bad("no-retry-exit-codes", f"{code} is not an exit status that fails a "
                          "task (1..255)")
        if self.max_consecutive_failures < 0:
            raise bad("max-consecutive-failures", "must not be negative")
        for name in ("task_time_limit", "time_limit", "idle_timeout"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise bad(name.replace("_", "-"), "must be positive")
        if self.poll_interval <= 0 or self.poll_interval > 60:
            raise bad("poll-interval", "must be more than 0 and at most 60 seconds")
        if self.scheduled_events not in SCHEDULED_EVENTS_MODES:
            raise bad("scheduled-events", "must be auto, on or off")
        if not re.match(r"^https?://[^/]+", self.scheduled_events_url or ""):
            raise bad("scheduled-events-url", "must be an http(s) URL")
        if self.scheduled_events_interval <= 0:
            raise bad("scheduled-events-interval", "must be positive")
        if self.metrics_interval <= 0:
            raise bad("metrics-interval", "must be positive")
        if self.metrics_port is not None and not 0 <= self.metrics_port <= 65535:
            raise bad("metrics-port", "must be 0..65535 (0: any free port, logged at start)")
        if not self.metrics_address.strip():
            raise bad("metrics-address", "must not be empty")
        if self.control not in CONTROL_MODES:
            raise bad("control", f"must be one of {', '.join(CONTROL_MODES)}")
        if self.control_account_url and self.control_connection_string:
            raise bad("control-account-url", "give --control-account-url or "
                      "--control-connection-string, not both")
        for name in ("heartbeat_interval", "control_interval"):
            if getattr(self, name) <= 0:
                raise bad(name.replace("_", "-"), "must be positive")
        if self.task_output not in TASK_OUTPUT_MODES:
            raise bad("task-output", f"must be one of {', '.join(TASK_OUTPUT_MODES)}")
        if not re.fullmatch(r"[a-z0-9](?!.*--)[a-z0-9-]{1,61}[a-z0-9]", self.task_log_container):
            raise bad("task-log-container", f"invalid container name {self.task_log_container!r}"
                      " (3-63 lower-case letters, digits and single hyphens)")
        for name in ("task_log_buffer", "task_output_max", "task_output_retention"):
            if getattr(self, name) <= 0:
                raise bad(name.replace("_", "-"), "must be positive")
        if self.task_limits not in TASK_LIMITS:
            raise bad("task-limits", "must be auto, systemd or rlimit")
        if self.log_format not in LOG_FORMATS:
            raise bad("log-format", "must be text or json")
        if self.log_level.upper() not in LOG_LEVELS:
            raise bad("log-level", f"must be one of {', '.join(LOG_LEVELS)}")
