"""Security: signed tasks, a command allow-list, an unprivileged task user, resource limits.

Everything a worker decides about *whether* and *how* a received task may run, built once at
start (``TaskGuard.from_settings``, main thread, before the backend is opened) and then only
read.  The worker calls ``refusal`` before a task runs, ``spawn_options``/``environment`` when
it spawns one and ``annotate_failure`` when one failed; all on the main thread.

Signatures: ``refusal`` checks a task's ``jobq_sig`` against the ``--signing-key-file`` keys
(the keys, the canonical form and the MAC are core/signing.py's, shared with jobq-ctl push
and the control records).

Resource limits (``--task-memory-limit``, ``--task-cpu-limit``, ``--task-max-procs``) are
applied by a launcher in front of the shell: a systemd scope (cgroups) or rlimits; see
worker/limits.py, which also words what a limit had to do with a failure.
"""

from __future__ import annotations

import grp
import logging
import math
import os
import pwd
import re
import stat
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..core.settings import Settings
from ..core.signing import SecurityConfigError, SigningKey, load_keys, unbound_warning, verify
from ..core.task import Task
from .env_policy import EnvPolicy
from .limits import TaskLimits, TaskUserIds

if TYPE_CHECKING:  # a name only: the dashboard reads this module without worker/process.py
    from .process import SpawnOptions

log = logging.getLogger("jobq.security")

MIN_KEY_BYTES = 16


# --------------------------------------------------------------------------- task user
@dataclass(frozen=True)
class TaskUser:
    name: str
    uid: int
    gid: int
    groups: tuple[int, ...]
    home: str


def resolve_user(user: str, group: str | None) -> TaskUser:
    """Look the task user (and group) up in passwd/group (main thread, at start)."""
    try:
        pw = pwd.getpwuid(int(user)) if user.isdigit() else pwd.getpwnam(user)
    except KeyError:
        raise SecurityConfigError(f"--task-user: no such user {user!r}") from None
    gid = pw.pw_gid
    if group:
        try:
            gid = grp.getgrgid(int(group)).gr_gid if group.isdigit() else grp.getgrnam(
                group).gr_gid
        except KeyError:
            raise SecurityConfigError(f"--task-group: no such group {group!r}") from None
    # Popen(user=) alone would keep root's supplementary groups: give the user's own.
    groups = tuple(os.getgrouplist(pw.pw_name, gid))
    return TaskUser(name=pw.pw_name, uid=pw.pw_uid, gid=gid, groups=groups, home=pw.pw_dir)


# ------------------------------------------------------------------------------ guard
@dataclass(frozen=True)
class TaskGuard:
    """The security policy of one worker; immutable after start."""

    keys: tuple[SigningKey, ...] = ()
    max_task_age: float | None = None
    accept_unbound: bool = False  # --accept-queue-unbound-signatures (an upgrade's window)
    allowed: re.Pattern[str] | None = None
    user: TaskUser | None = None
    limits: TaskLimits = field(default_factory=TaskLimits)
    env_policy: EnvPolicy = field(default_factory=EnvPolicy)
    warnings: tuple[str, ...] = ()

    @classmethod
    def from_settings(cls, s: Settings, euid: int | None = None) -> TaskGuard:
        """Check the security options and read the key files (main thread, at start).

        Raises SecurityConfigError -- one line naming the option -- for anything that cannot
        work.  Warnings are collected in ``warnings`` for ``log_warnings`` (logging may not be
        set up yet)."""
        euid = os.geteuid() if euid is None else euid
        warnings: list[str] = []
        keys = load_keys(s.signing_key_file)
        for k in keys:
            if len(k.secret) < MIN_KEY_BYTES:
                warnings.append(f"--signing-key-file: {k.path} holds only {len(k.secret)} "
                                f"bytes; use at least 32 random bytes")
        accept_unbound = s.accept_queue_unbound_signatures
        if (text := unbound_warning(accept_unbound, keys)) is not None:
            warnings.append(text)
        max_age = s.max_task_age
        if max_age is not None:
            if max_age <= 0:
                raise SecurityConfigError("--max-task-age: must be positive")
            if not keys:
                raise SecurityConfigError("--max-task-age: needs --signing-key-file (the "
                                          "issue time is only trustworthy when signed)")
        allowed = None
        pattern = s.allowed_commands
        if pattern is not None:
            try:
                allowed = re.compile(pattern)
            except re.error as exc:
                raise SecurityConfigError(
                    f"--allowed-commands: invalid regular expression: {exc}") from None
        user = None
        task_user = s.task_user
        task_group = s.task_group
        if task_group and not task_user:
            raise SecurityConfigError("--task-group: needs --task-user")
        if task_user:
            if euid != 0:
                raise SecurityConfigError(
                    f"--task-user: switching to another user needs root; this supervisor "
                    f"runs as uid {euid} (start it as root, or drop --task-user)")
            user = resolve_user(task_user, task_group)
        elif euid == 0:
            warnings.append("tasks run as root (no --task-user): a task can do anything on "
                            "this machine, including reading this supervisor's credentials")
        memory = s.task_memory_limit
        cpu = s.task_cpu_limit
        procs = s.task_max_procs
        for option, value in (("--task-memory-limit", memory), ("--task-cpu-limit", cpu),
                              ("--task-max-procs", procs)):
            if value is not None and value <= 0:
                raise SecurityConfigError(f"{option}: must be positive")
        try:
            limits = TaskLimits.configure(
                memory, math.ceil(cpu) if cpu is not None else None, procs,
                s.task_limits or "auto", euid,
                run_as_other_user=user is not None)
        except ValueError as exc:
            raise SecurityConfigError(str(exc)) from None
        if (procs is not None and limits.mechanism == "rlimit"
                and (user is None or user.uid == 0) and euid == 0):
            warnings.append("--task-max-procs is not enforced for tasks that run as root "
                            "(RLIMIT_NPROC does not apply to root); use --task-user")
        warnings += secret_file_warnings(s.config_file,
                                         [k.path for k in keys])
        # The command is the whole story only when env and cwd cannot change what it runs.
        env_policy = EnvPolicy.from_settings(
            allowed is not None or bool(keys), s.allowed_env, s.refused_env, s.allowed_cwd)
        return cls(keys=tuple(keys), max_task_age=max_age, allowed=allowed, user=user,
                   limits=limits, env_policy=env_policy, warnings=tuple(warnings),
                   accept_unbound=accept_unbound)

    def log_warnings(self) -> None:
        """One WARNING line each (main thread, once: when the first receive succeeded)."""
        for text in self.warnings:
            log.warning("%s", text)

    # -- before a run --------------------------------------------------------------------
    def refusal(self, task: Task, now: float, *, queue: str) -> str | None:
        """Why this task, received from ``queue``, must not run (it is dead-lettered), or None
        (main thread)."""
        if self.keys:
            reason = verify(task, self.keys, self.max_task_age, now, queue=queue,
                            accept_unbound=self.accept_unbound)
            if reason:
                return reason
        if self.allowed is not None and not self.allowed.fullmatch(task.cmd):
            return "command not allowed (--allowed-commands)"
        return self.env_policy.refusal(task.env, task.cwd)

    # -- spawning --------------------------------------------------------------------------
    def spawn_options(self, marker: str) -> SpawnOptions:
        """Keyword arguments for TaskProcess.spawn of the task with ``marker`` (main thread)."""
        ids = None
        if self.user is not None:
            ids = TaskUserIds(self.user.uid, self.user.gid, self.user.groups)
        opts: SpawnOptions = {"argv_prefix": self.limits.argv_prefix(marker, ids)}
        if ids is not None and not self.limits.switches_user:
            opts.update({"user": ids.uid, "group": ids.gid, "extra_groups": list(ids.groups)})
        return opts

    def environment(self) -> dict[str, str]:
        """Variables that follow from the task user (the message's own env still wins)."""
        if self.user is None:
            return {}
        return {"HOME": self.user.home, "USER": self.user.name, "LOGNAME": self.user.name}

    # -- after a run -----------------------------------------------------------------------
    def annotate_failure(self, status: str, returncode: int, tail: str,
                         marker: str | None = None) -> str:
        """``status`` plus what a limit had to do with it (main thread); see worker/limits.py."""
        return self.limits.annotate_failure(status, returncode, tail, marker)


def secret_file_warnings(config_file: str | None, key_files: Sequence[str]) -> list[str]:
    """One line per world-readable file that holds a secret (main thread, at start)."""
    out = []
    if config_file and _world_readable(config_file) and _has_connection_string(config_file):
        out.append(f"{config_file} holds a connection string and is readable by every user "
                   f"(chmod o-r {config_file})")
    for path in key_files:
        if _world_readable(path):
            out.append(f"signing key file {path} is readable by every user (chmod o-r {path})")
    return out


def _world_readable(path: str) -> bool:
    try:
        return bool(os.stat(path).st_mode & stat.S_IROTH)
    except OSError:
        return False


def _has_connection_string(path: str) -> bool:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            text = fh.read()
    except OSError:
        return False
    return re.search(r"^\s*connection[-_]string\s*[=:]\s*\S", text, re.MULTILINE) is not None
