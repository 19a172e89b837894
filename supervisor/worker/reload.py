"""``systemctl reload`` (SIGUSR2): re-read the configuration the worker started with.

Main thread only: the signal handler only enqueues the number, the lifecycle hands it here
while the worker runs (a draining, preempting or stopping worker ignores it, logged:
worker/lifecycle.py).  The start's command line and environment are parsed again with the
config file as it is now, by the same parser and checks as a start (worker/main.py
``reread_settings``; the task guard's too when one of its options changed).  Invalid: one
ERROR line naming the problem, and the worker goes on with its old settings.  Valid: what
can change live is applied (``LIVE``: the log level; everything else is built into threads,
clients and open files at start), and one WARNING line names the changed settings that wait
for the next restart.

A reload is never a stop: a generic reload (configuration management, logrotate's
``postrotate``) used to drain the worker and leave the unit down.  The drain is SIGUSR1 or
``jobq-ctl drain``.  systemd hears ``RELOADING=1`` at the start and ``READY=1`` at the end,
whatever the outcome, so the unit is back to "active (running)" when the reload is over.
"""

from __future__ import annotations

import logging
from dataclasses import fields
from typing import Callable

from ..core.options import UsageError
from ..core.settings import Settings
from ..core.signing import SecurityConfigError
from .logs import set_level
from .notify import Notifier
from .task_guard import TaskGuard

log = logging.getLogger("jobq.worker")

# Settings a reload applies at once (``_reload`` knows how); the others take effect at the next
# restart.
LIVE = ("log_level",)
# What TaskGuard.from_settings reads: a change there is checked as a start checks it, so that
# a key file that cannot be read shows now, not at the next restart (exit 2).
GUARD_FIELDS = ("signing_key_file", "max_task_age", "accept_queue_unbound_signatures",
                "allowed_commands", "allowed_env", "refused_env", "allowed_cwd", "task_user",
                "task_group", "task_memory_limit", "task_cpu_limit", "task_max_procs",
                "task_limits")


def option(name: str) -> str:
    """``num_workers`` -> ``num-workers``: the option's (and INI key's) name."""
    return name.replace("_", "-")


class Reloader:
    """Re-reads the configuration on SIGUSR2 (main thread).

    ``reread(worker_id)``: the start's command line and environment parsed again (raises
    UsageError); None in a worker run in-process without one (tests).  ``ready()``: whether
    the start's ``READY=1`` went out -- before it, a ``READY=1`` here would end the start."""

    def __init__(self, started: Settings, reread: Callable[[str], Settings] | None,
                 notifier: Notifier, ready: Callable[[], bool]) -> None:
        self.started = started
        self.log_level = started.log_level.upper()  # as applied now
        self.reread = reread
        self.notifier = notifier
        self.ready = ready

    def reload(self) -> None:
        """One reload, from the main loop (main thread)."""
        tell_systemd = self.ready()
        if tell_systemd:
            self.notifier.reloading()
        try:
            self._reload()
        finally:  # always: a unit left "reloading" would wait for it until its timeout
            if tell_systemd:
                self.notifier.ready()

    def _reload(self) -> None:
        if self.reread is None:
            log.warning("SIGUSR2 received: reload: nothing to re-read (no command line)")
            return
        try:
            new = self.reread(self.started.worker_id)
            if any(getattr(new, f) != getattr(self.started, f) for f in GUARD_FIELDS):
                TaskGuard.from_settings(new)
        except (UsageError, SecurityConfigError) as exc:
            log.error("SIGUSR2 received: reload refused, the worker goes on with its "
                      "settings as they were: %s", exc)
            return
        source = self.started.config_file or "command line and environment"
        level, was = new.log_level.upper(), self.log_level
        # The line shows at the more verbose of the two levels: INFO -> WARNING still tells.
        quieter = logging.getLevelName(level) > logging.getLevelName(was)
        if level != was and not quieter:
            set_level(level)
        log.info("SIGUSR2 received: reload of %s: %s", source,
                 f"log-level {was} -> {level}" if level != was else "nothing to change now")
        if level != was and quieter:
            set_level(level)
        self.log_level = level
        later = [option(f.name) for f in fields(Settings)
                 if f.name not in LIVE and getattr(new, f.name) != getattr(self.started, f.name)]
        if later:
            log.warning("reload: changed settings that take effect only at the next restart "
                        "(systemctl restart: running tasks go back to the queue, no attempt "
                        "counted): %s", ", ".join(later))
