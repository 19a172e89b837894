"""Resource limits per task: a systemd scope (cgroups) where possible, else rlimits.

Two mechanisms, both a launcher in front of ``/bin/bash -c CMD`` that execs in place, so the
task keeps its pid, its process group and its marker, and no ``preexec_fn`` runs in the
forked child (unsafe with threads):

* ``systemd``: ``systemd-run --scope --unit=jobq-<worker>-<seq>.scope -p MemoryMax=..
  -p MemorySwapMax=0 -p TasksMax=.. [-p OOMPolicy=kill] -- [prlimit --cpu=..] [setpriv ..] --``.
  systemd-run asks the manager for a transient scope holding its own pid, waits for it and
  execs the rest.  The cgroup covers the whole task tree, including processes that fork,
  ``setsid`` or daemonize, and counts real memory (RSS + page cache), not address space.
  TasksMax caps the tree's processes and threads for any user, root included.  A CPU-seconds
  budget has no cgroup equivalent (CPUQuota= is a rate, RuntimeMaxSec= wall time), so
  ``--task-cpu-limit`` stays RLIMIT_CPU via prlimit after systemd-run: per process.  The task
  user is switched by util-linux ``setpriv`` after systemd-run, because systemd-run must talk
  to the manager as the supervisor's user and its own ``--uid`` drops the supplementary groups.
  No ``--collect``: a scope that ends normally is unloaded anyway, while one the OOM killer hit
  stays loaded as failed with ``Result=oom-kill`` until ``oom_killed`` read it (then it is
  reset).  That is systemd's own, certain record; it exists only where systemd sees OOM kills
  (systemd >= 252 -- probed as "OOMPolicy= accepted for a scope" -- with the memory
  controller on cgroup v2).  Elsewhere a memory failure is still a guess.
* ``rlimit``: ``prlimit --as=.. --cpu=.. --nproc=.. --``.  Per process: a task that forks gets
  the memory and CPU budget again in each child; RLIMIT_AS counts address space, not resident
  memory; RLIMIT_NPROC counts all processes of the real user and does not bind root.

``--task-limits auto`` (default) picks systemd when systemd is the init system
(``/run/systemd/system``), systemd-run and systemctl are on PATH and the manager can create a
scope: as root the system manager; otherwise the user manager, only when reachable
(``$XDG_RUNTIME_DIR/systemd/private``).  "Can create" is proved by starting one scope running
``/bin/true`` with the very properties tasks get; the limits only apply when limits are set.

Who calls what: ``TaskLimits.configure`` on the main thread at start; ``argv_prefix`` on the
main thread when a task is dispatched; ``oom_killed`` on the main thread after a task failed
(one ``systemctl show``, bounded by a timeout; the reset runs on a short-lived thread).
"""

from __future__ import annotations

import itertools
import logging
import os
import re
import shutil
import signal
import subprocess
from dataclasses import dataclass, replace
from functools import partial

from ..core.sizes import format_size
from ..core.threads import start_thread

log = logging.getLogger("jobq.limits")

MECHANISMS = ("auto", "systemd", "rlimit")
PROBE_TIMEOUT = 10.0  # a first scope may take a while on a busy manager; only at start
SHOW_TIMEOUT = 2.0  # the main thread waits at most this long after a failed task
SYSTEMD_DIR = "/run/systemd/system"
_PROBES = itertools.count(1)
# Output that a failed allocation leaves behind (Python, C/libc, C++, Java, bash).
_ALLOC_FAILURE = re.compile(
    r"MemoryError|Cannot allocate memory|std::bad_alloc|out of memory|OutOfMemoryError"
    r"|memory exhausted|failed to allocate|allocation failed", re.IGNORECASE)
_MEMORY_SIGNALS = (signal.SIGSEGV, signal.SIGABRT, signal.SIGBUS, signal.SIGKILL)


class LimitsUnavailable(Exception):
    """The systemd mechanism cannot work here; the message says why (one line)."""


@dataclass(frozen=True)
class TaskUserIds:
    uid: int
    gid: int
    groups: tuple[int, ...]


@dataclass(frozen=True)
class TaskLimits:
    """The limits of every task and how they are applied; immutable after start."""

    memory: int | None = None  # bytes
    cpu: int | None = None  # CPU seconds
    procs: int | None = None
    mechanism: str = "rlimit"  # "systemd" or "rlimit"
    prlimit: str | None = None
    systemd_run: str | None = None
    systemctl: str | None = None
    setpriv: str | None = None
    user_manager: bool = False  # systemd-run --user (the supervisor is not root)
    oom_policy: bool = False  # the manager accepted OOMPolicy=kill for a scope
    oom_certain: bool = False  # the manager records OOM kills (Result=oom-kill)

    @property
    def any(self) -> bool:
        return self.memory is not None or self.cpu is not None or self.procs is not None

    @classmethod
    def configure(cls, memory: int | None, cpu: int | None, procs: int | None,
                  mode: str = "auto", euid: int | None = None,
                  run_as_other_user: bool = False) -> TaskLimits:
        """Pick the mechanism (main thread, at start).  Raises ValueError with one line that
        names the option when ``mode`` or the limits cannot work."""
        euid = os.geteuid() if euid is None else euid
        if mode not in MECHANISMS:
            raise ValueError(f"--task-limits: must be one of {', '.join(MECHANISMS)}")
        wanted = memory is not None or cpu is not None or procs is not None
        limits = cls(memory=memory, cpu=cpu, procs=procs)
        if mode == "rlimit" or (mode == "auto" and not wanted):
            return limits._with_rlimit() if wanted else limits
        try:
            found = limits._with_systemd(euid, run_as_other_user)
        except LimitsUnavailable as exc:
            if mode == "systemd":
                raise ValueError(f"--task-limits systemd: {exc}") from None
            log.debug("systemd scopes unusable: %s", exc)
            return limits._with_rlimit()
        return found

    def _with_rlimit(self) -> TaskLimits:
        prlimit = shutil.which("prlimit")
        if prlimit is None:
            raise ValueError(f"{self._first_option()}: needs util-linux prlimit, which is not "
                             f"on PATH")
        return replace(self, mechanism="rlimit", prlimit=prlimit)

    def _with_systemd(self, euid: int, run_as_other_user: bool) -> TaskLimits:
        if not os.path.isdir(SYSTEMD_DIR):
            raise LimitsUnavailable(f"systemd is not the init system (no {SYSTEMD_DIR})")
        tools = {name: shutil.which(name) for name in ("systemd-run", "systemctl")}
        for name, path in tools.items():
            if path is None:
                raise LimitsUnavailable(f"{name} is not on PATH")
        user_manager = euid != 0
        if user_manager:
            runtime = os.environ.get("XDG_RUNTIME_DIR", "")
            if not runtime or not os.path.exists(os.path.join(runtime, "systemd", "private")):
                raise LimitsUnavailable(
                    f"uid {euid} has no reachable systemd user manager (no "
                    f"$XDG_RUNTIME_DIR/systemd/private; loginctl enable-linger)")
        prlimit = setpriv = None
        if self.cpu is not None:
            prlimit = shutil.which("prlimit")
            if prlimit is None:
                raise LimitsUnavailable("--task-cpu-limit needs util-linux prlimit")
        if run_as_other_user:
            setpriv = shutil.which("setpriv")
            if setpriv is None:
                raise LimitsUnavailable("--task-user needs util-linux setpriv")
        found = replace(self, mechanism="systemd", systemd_run=tools["systemd-run"],
                         systemctl=tools["systemctl"], prlimit=prlimit, setpriv=setpriv,
                         user_manager=user_manager, oom_policy=True)
        # OOMPolicy= for scopes is systemd >= 252: older managers refuse the property, so try
        # without it before giving up.
        error = found._probe()
        if error is not None:
            found = replace(found, oom_policy=False)
            if found._probe() is not None:
                raise LimitsUnavailable(f"cannot start a transient scope: {error}")
        return replace(found, oom_certain=found.oom_policy and _memory_on_cgroup2())

    def _probe(self) -> str | None:
        """Start one scope running /bin/true; None if that worked, else systemd-run's error."""
        unit = f"jobq-probe-{os.getpid()}-{next(_PROBES)}.scope"
        argv = [*self._scope_argv(unit), "/bin/true"]
        try:
            res = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True,
                                 text=True, timeout=PROBE_TIMEOUT)
        except subprocess.TimeoutExpired:
            return f"systemd-run did not answer within {PROBE_TIMEOUT:g}s"
        except OSError as exc:
            return f"cannot run systemd-run: {exc.strerror}"
        if res.returncode == 0:
            return None
        lines = [line for line in res.stderr.splitlines() if line.strip()]
        return lines[0].strip() if lines else f"systemd-run exited with {res.returncode}"

    def _first_option(self) -> str:
        return ("--task-memory-limit" if self.memory is not None else
                "--task-cpu-limit" if self.cpu is not None else "--task-max-procs")

    # -- spawning ------------------------------------------------------------------------
    def describe(self) -> str:
        """One line for the start-up log."""
        if not self.any:
            return "task limits: none"
        if self.mechanism == "rlimit":
            return "task limits: rlimits via prlimit (per process)"
        where = "user manager" if self.user_manager else "system manager"
        oom = ("OOM kills recorded by systemd" if self.oom_certain
               else "OOM kills not recorded by this systemd (memory failures are a guess)")
        return f"task limits: systemd scopes ({where}; {oom})"

    def _scope_argv(self, unit: str) -> list[str]:
        assert self.systemd_run is not None
        argv = [self.systemd_run]
        if self.user_manager:
            argv.append("--user")
        argv += ["--scope", "--quiet", f"--unit={unit}"]
        if self.memory is not None:
            argv += ["-p", f"MemoryMax={self.memory}", "-p", "MemorySwapMax=0"]
            if self.oom_policy:
                argv += ["-p", "OOMPolicy=kill"]
        if self.procs is not None:
            argv += ["-p", f"TasksMax={self.procs}"]
        return argv + ["--"]

    def argv_prefix(self, marker: str, user: TaskUserIds | None = None) -> list[str]:
        """The launchers in front of ``/bin/bash -c CMD`` for the task with ``marker``.

        With systemd and a task user, the ids are switched by setpriv (the caller must then
        not pass them to Popen)."""
        argv: list[str] = []
        if self.mechanism == "systemd" and self.any:
            argv = self._scope_argv(unit_name(marker))
        if self.prlimit is not None and (self.mechanism == "rlimit" or self.cpu is not None):
            argv.append(self.prlimit)
            if self.mechanism == "rlimit" and self.memory is not None:
                argv.append(f"--as={self.memory}")
            if self.cpu is not None:
                # soft < hard: SIGXCPU first (catchable: a task may save its state), SIGKILL a
                # CPU-second later.  With soft == hard the kernel goes straight to SIGKILL.
                argv.append(f"--cpu={self.cpu}:{self.cpu + 1}")
            if self.mechanism == "rlimit" and self.procs is not None:
                argv.append(f"--nproc={self.procs}")
            argv.append("--")
        if user is not None and self.switches_user:
            assert self.setpriv is not None
            groups = (f"--groups={','.join(str(g) for g in user.groups)}" if user.groups
                      else "--clear-groups")
            argv += [self.setpriv, f"--reuid={user.uid}", f"--regid={user.gid}", groups, "--"]
        return argv

    @property
    def switches_user(self) -> bool:
        """True when the launcher, not Popen, switches to the task user."""
        return self.mechanism == "systemd" and self.any and self.setpriv is not None

    # -- after a run ----------------------------------------------------------------------
    def annotate_failure(self, status: str, returncode: int, tail: str,
                         marker: str | None = None) -> str:
        """``status`` plus what a limit had to do with it (main thread).

        Honest about certainty: SIGXCPU is unambiguous (the kernel sends it for RLIMIT_CPU
        alone) and so is systemd's record of an OOM kill in the task's scope; the rest is a
        likely cause, so it ends in "?"."""
        sig = -returncode if returncode < 0 else (returncode - 128 if returncode > 128 else 0)
        if self.memory is not None and returncode != 0 and marker is not None:
            oom = self.oom_killed(marker)
            if oom:
                return (f"memory limit {format_size(self.memory)} exceeded (killed by the OOM "
                        f"killer): {status}")
            if oom is False:  # systemd would know: memory is not the cause
                return self._cpu_reason(status, sig) or status
        cpu = self._cpu_reason(status, sig)
        if cpu:
            return cpu
        if self.memory is not None and returncode != 0 and (
                sig in _MEMORY_SIGNALS or _ALLOC_FAILURE.search(tail[-4096:])):
            return f"{status} (memory limit {format_size(self.memory)} exceeded?)"
        return status

    def _cpu_reason(self, status: str, sig: int) -> str | None:
        if self.cpu is not None:
            if sig == signal.SIGXCPU:
                return f"cpu limit of {self.cpu}s exceeded ({status})"
            if sig == signal.SIGKILL:
                return f"{status} (cpu limit of {self.cpu}s exceeded?)"
        return None

    def oom_killed(self, marker: str) -> bool | None:
        """Did the OOM killer hit the task's scope?  True/False when systemd knows, None when
        it cannot tell (main thread, after a failed task; at most SHOW_TIMEOUT)."""
        if self.mechanism != "systemd" or self.memory is None or not self.oom_certain:
            return None
        unit = unit_name(marker)
        try:
            res = subprocess.run(self._systemctl("show", "--property=Result", "--value", unit),
                                 stdin=subprocess.DEVNULL, capture_output=True, text=True,
                                 timeout=SHOW_TIMEOUT)
        except (subprocess.TimeoutExpired, OSError) as exc:
            log.warning("cannot ask systemd about %s: %s", unit, exc)
            return None
        if res.returncode != 0:
            return None
        result = res.stdout.strip()
        if result not in ("success", ""):
            # A failed scope stays loaded (that is how its Result survived): unload it.
            start_thread(partial(self._reset_failed, unit), "reset-failed")
        return result == "oom-kill"

    def _systemctl(self, *args: str) -> list[str]:
        assert self.systemctl is not None
        return [self.systemctl, *(["--user"] if self.user_manager else []), *args]

    def _reset_failed(self, unit: str) -> None:
        """reset-failed thread: unload one failed scope; failures only cost a stale entry."""
        try:
            subprocess.run(self._systemctl("reset-failed", unit), stdin=subprocess.DEVNULL,
                           capture_output=True, timeout=PROBE_TIMEOUT)
        except (subprocess.TimeoutExpired, OSError) as exc:
            log.warning("cannot reset the failed scope %s: %s", unit, exc)


def unit_name(marker: str) -> str:
    """``jobq-<worker token>-<seq>.scope``: unique per task and worker run."""
    return "jobq-" + marker.replace(":", "-") + ".scope"


def _memory_on_cgroup2() -> bool:
    """True when the memory controller is on the cgroup v2 hierarchy (unified or hybrid)."""
    for path in ("/sys/fs/cgroup/cgroup.controllers",
                 "/sys/fs/cgroup/unified/cgroup.controllers"):
        try:
            with open(path) as fh:
                if "memory" in fh.read().split():
                    return True
        except OSError:
            continue
    return False


