"""A task's processes: spawn its shell, find its whole tree, signal it, reap it.

"The task" is its process group **plus** every descendant that left the group (``setsid``,
``set -o monitor``) **plus** orphans of it that the kernel reparented to the supervisor
(we are a child subreaper).  Orphans are recognised by the ``JOBQ_LIFELINE`` marker each task
inherits in its environment; the marker carries a per-task sequence number, so a process
spawned a moment ago but not yet registered is never mistaken for anybody's orphan.

Who calls what: ``TaskProcess.spawn`` runs on the spawner threads (worker/spawner.py; the shell is
started by worker/shell.py).  Reaping stays on the main thread, the only one that waits for
children:
``TaskProcess.poll``, ``exited_child`` and ``reap_orphans``.  The watchdog thread, the only one
that signals, does so through a ``Signaller`` (``signal_group``, ``signal_pids``,
``task_trees``, ``adopted``, ``group_alive``), which unit tests replace with a fake.
"""

from __future__ import annotations

import collections
import ctypes
import errno
import logging
import os
import signal
import subprocess
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import TypedDict

import psutil

from ..core.secret_names import without_secrets
from .output_pump import TaskOutput
from .shell import SpawnedShell, popen_shell, posix_spawn_shell

log = logging.getLogger("jobq.process")

MARKER_VAR = "JOBQ_LIFELINE"
PR_SET_CHILD_SUBREAPER = 36



def set_child_subreaper() -> bool:
    """Make orphaned descendants reparent to us, so psutil still finds them (main thread)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def task_environment(base: dict[str, str], extra: dict[str, str],
                     pass_env: Collection[str] = ()) -> dict[str, str]:
    """Inherited environment minus secrets (core/secret_names.py; the names in ``pass_env`` kept
    anyway), plus ``extra`` (our variables, the message's env)."""
    env = without_secrets(base, pass_env)
    env.update(extra)
    return env


class SpawnOptions(TypedDict, total=False):
    """The keywords of ``TaskProcess.spawn`` that follow from the task user and limits
    (``TaskGuard.spawn_options``)."""

    argv_prefix: Sequence[str]
    user: int
    group: int
    extra_groups: Sequence[int]


@dataclass
class TaskProcess:
    """One running task's process: its shell's Popen (or SpawnedShell), group and marker."""

    popen: subprocess.Popen | SpawnedShell
    marker: str  # value of JOBQ_LIFELINE in the task's environment
    pgid: int
    output: TaskOutput | None = None
    returncode: int | None = None

    @property
    def pid(self) -> int:
        return self.popen.pid

    @classmethod
    def spawn(cls, cmd: str, env: dict[str, str], cwd: str | None, marker: str, *,
              argv_prefix: Sequence[str] = (), user: int | None = None,
              group: int | None = None, extra_groups: Sequence[int] | None = None,
              ) -> TaskProcess:
        """Start ``bash -c cmd`` in a new session (a spawner thread).  Raises OSError.

        ``argv_prefix`` are launchers that exec the shell in place (``systemd-run --scope``,
        ``prlimit``, ``setpriv``), so the pid stays the group leader; ``user``/``group``/
        ``extra_groups`` are Popen's own (the child switches ids between fork and exec, without
        a preexec_fn)."""
        env = dict(env)
        env[MARKER_VAR] = marker
        if not argv_prefix and cwd is None and user is None and group is None \
                and extra_groups is None:
            shell = posix_spawn_shell(["/bin/bash", "-c", cmd], env)
            if shell is not None:  # the shell leads its own session and group
                return cls(popen=shell, marker=marker, pgid=shell.pid)
        # A forked child inherits this thread's signal mask, which blocks the supervisor's
        # signals (core/threads.py): the task must start with none blocked.
        blocked = signal.pthread_sigmask(signal.SIG_SETMASK, ())
        try:
            popen = popen_shell(argv_prefix, cmd, env, cwd, user, group, extra_groups,
                                keep=(MARKER_VAR,))
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        # With start_new_session the shell is its group's (and session's) leader.
        return cls(popen=popen, marker=marker, pgid=popen.pid)

    def poll(self) -> int | None:
        """Reap the shell if it exited (main thread)."""
        if self.returncode is None:
            self.returncode = self.popen.poll()
        return self.returncode

    def group_alive(self) -> bool:
        """True while any process is left in the task's process group (any thread)."""
        return group_alive(self.pgid)


def group_alive(pgid: int) -> bool:
    """True while any process is left in process group ``pgid`` (any thread)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def group_running(pgid: int) -> bool:
    """True while a process of group ``pgid`` runs; zombies -- dead, not yet reaped -- do not
    count (any thread; scans /proc: for rare paths only)."""
    if not group_alive(pgid):
        return False
    for proc in psutil.process_iter(["status"]):
        try:
            if os.getpgid(proc.pid) == pgid and proc.info["status"] != psutil.STATUS_ZOMBIE:
                return True
        except (OSError, psutil.Error):  # gone meanwhile
            continue
    return False


def exited_child() -> int | None:
    """The pid of a child of ours that has exited and is not reaped yet, or None; reaps
    nothing (main thread).

    One ``waitid(WNOWAIT)`` names the shell to reap, instead of a ``poll()`` per running task:
    with 1,000 tasks, one system call a turn instead of a thousand (and every system call
    hands the GIL to another thread and waits to get it back)."""
    try:
        info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:  # no children at all
        return None
    return info.si_pid if info is not None else None


def our_children() -> list[int]:
    """Pids whose parent is this process (forks and adopted orphans land on the main thread)."""
    pids: list[int] = []
    me = os.getpid()
    try:
        with open(f"/proc/{me}/task/{me}/children") as fh:
            pids = [int(p) for p in fh.read().split()]
    except OSError:
        pids = [p.pid for p in psutil.Process(me).children()]
    return pids


def read_marker(pid: int) -> str | None:
    """The JOBQ_LIFELINE value in a process's environment, or None (gone, zombie, foreign)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            data = fh.read()
    except OSError:
        return None
    prefix = MARKER_VAR.encode() + b"="
    for item in data.split(b"\0"):
        if item.startswith(prefix):
            return item[len(prefix):].decode("ascii", "replace")
    return None


def ppid_map() -> dict[int, list[int]]:
    """parent pid -> child pids, one pass over /proc (watchdog thread, only when signalling)."""
    children: dict[int, list[int]] = collections.defaultdict(list)
    for proc in psutil.process_iter(["ppid"]):
        ppid = proc.info.get("ppid")
        if ppid is not None:
            children[ppid].append(proc.pid)
    return children


def descendants(roots: Iterable[int], children: dict[int, list[int]]) -> set[int]:
    seen: set[int] = set()
    stack = list(roots)
    while stack:
        pid = stack.pop()
        for child in children.get(pid, ()):
            if child not in seen:
                seen.add(child)
                stack.append(child)
    return seen


def task_trees(tasks: Iterable[TaskProcess], shell_pids: set[int]) -> dict[str, set[int]]:
    """Every pid of every given task except its group members (killpg covers those).

    Descendants of a live shell, plus orphans adopted by us that carry the task's marker, plus
    their descendants.  ``shell_pids`` are all registered shells; they are never orphans.
    """
    tasks = list(tasks)
    children = ppid_map()
    by_marker: dict[str, set[int]] = {t.marker: set() for t in tasks}
    for pid in children.get(os.getpid(), ()):
        if pid in shell_pids:
            continue
        marker = read_marker(pid)
        if marker in by_marker:
            by_marker[marker].add(pid)
    result: dict[str, set[int]] = {}
    for t in tasks:
        roots = set(by_marker[t.marker])
        if t.returncode is None:
            roots.add(t.pid)
        pids = descendants(roots, children) | by_marker[t.marker]
        pids.discard(t.pid)
        # killpg reached the group's members; one started since (what the task's own SIGTERM
        # trap runs: its cleanup) must not get the signal a second time
        result[t.marker] = {pid for pid in pids if not in_group(pid, t.pgid)}
    return result


def in_group(pid: int, pgid: int) -> bool:
    """Whether ``pid`` is in process group ``pgid`` (a pid already gone: no)."""
    try:
        return os.getpgid(pid) == pgid
    except OSError:
        return False


def signal_pids(pids: Iterable[int], sig: int) -> int:
    """Send ``sig`` to each pid, tolerating ESRCH/EPERM; return how many were signalled."""
    sent = 0
    for pid in pids:
        try:
            os.kill(pid, sig)
            sent += 1
        except ProcessLookupError:
            pass
        except PermissionError as exc:
            log.warning("cannot signal pid %d: %s", pid, exc)
    return sent


def signal_group(pgid: int, sig: int) -> bool:
    try:
        os.killpg(pgid, sig)
        return True
    except ProcessLookupError:
        return False
    except PermissionError as exc:
        if exc.errno == errno.EPERM:
            log.warning("cannot signal process group %d: %s", pgid, exc)
        return False


def _stat_fields(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            data = fh.read()
    except OSError:
        return None
    # comm may hold spaces and parentheses; the fields after the last ')' are fixed.
    return data[data.rindex(")") + 2:].split()


def reap_orphans(registered: set[int]) -> list[int]:
    """Reap exited orphans of tasks by their own pid (main thread; never waitpid(-1)).

    An orphan is recognised without its (unreadable) zombie environment: every task process
    lives in a session other than ours, while a helper the SDK spawns (e.g. the az CLI for
    DefaultAzureCredential) stays in our session and keeps its exit status for its Popen.
    """
    my_sid = os.getsid(0)
    reaped = []
    for pid in our_children():
        if pid in registered:
            continue
        fields = _stat_fields(pid)
        if fields is None or fields[0] != "Z" or int(fields[3]) == my_sid:
            continue
        try:
            done, _status = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            continue
        if done:
            reaped.append(pid)
    return reaped


class Signaller:
    """Everything the watchdog does to processes, behind one object (watchdog thread).

    These are the real OS calls; unit tests hand the watchdog a fake instead, so that its
    rules run with a fake clock and no process at all."""

    def signal_group(self, pgid: int, sig: int) -> bool:
        return signal_group(pgid, sig)

    def signal_pids(self, pids: Iterable[int], sig: int) -> int:
        return signal_pids(pids, sig)

    def group_alive(self, pgid: int) -> bool:
        return group_alive(pgid)

    def group_running(self, pgid: int) -> bool:
        return group_running(pgid)

    def task_trees(self, tasks: Iterable[TaskProcess],
                   shell_pids: set[int]) -> dict[str, set[int]]:
        return task_trees(tasks, shell_pids)

    def adopted(self, markers: set[str], exclude: set[int]) -> list[int]:
        """Our children, other than ``exclude``, that carry one of ``markers``: orphans of
        those tasks adopted by us (one read of our children, one environ read per child)."""
        return [p for p in our_children() if p not in exclude and read_marker(p) in markers]
