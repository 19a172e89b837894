"""How a task's shell is started: ``os.posix_spawn`` where it can, ``subprocess.Popen`` else.

Both start ``bash -c CMD`` as the leader of a new session, stdin on /dev/null, stdout and
stderr on one pipe.  Called on the spawner threads (spawner.py) through ``TaskProcess.spawn``.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Sequence
from typing import IO


class SpawnedShell:
    """What a task needs of ``subprocess.Popen`` -- pid, stdout, poll(), returncode -- for a
    shell started with ``os.posix_spawn`` (main thread polls; one reaper only)."""

    __slots__ = ("pid", "stdout", "returncode")

    def __init__(self, pid: int, stdout: IO[bytes]) -> None:
        self.pid = pid
        self.stdout: IO[bytes] | None = stdout
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # reaped elsewhere: the status is gone (as Popen does)
                self.returncode = 0
                return 0
            if pid == self.pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode


# Signals the supervisor ignores (Python ignores SIGPIPE) stay ignored across exec: a task gets
# them back at their defaults, as Popen's restore_signals does.
_RESTORED_SIGNALS = tuple(getattr(signal, n) for n in ("SIGPIPE", "SIGXFZ", "SIGXFSZ")
                          if hasattr(signal, n))


def posix_spawn_shell(argv: list[str], env: dict[str, str]) -> SpawnedShell | None:
    """Start ``argv`` (absolute path) in a new session with stdout+stderr on a pipe, or None
    when this path does not apply (a spawner thread).  Raises OSError.

    ``os.posix_spawn`` (glibc: clone(CLONE_VM|CLONE_VFORK), all in C) costs the supervisor
    ~0.2 ms of CPU per task where ``Popen`` costs ~0.5 ms (measured here, bash -c true); at
    hundreds of tasks a second that is a good part of the supervisor's own cost.  It inherits
    only inheritable descriptors, and everything Python opens is non-inheritable (PEP 446),
    so it needs no close_fds."""
    r, w = os.pipe2(os.O_CLOEXEC)
    if min(r, w) <= 2:  # stdin/stdout/stderr were closed: let Popen sort the fds out
        os.close(r)
        os.close(w)
        return None
    try:
        pid = os.posix_spawn(argv[0], argv, env, setsid=True, setsigdef=_RESTORED_SIGNALS,
                             setsigmask=(),  # not the spawner thread's (it blocks ours)
                             file_actions=[(os.POSIX_SPAWN_DUP2, _devnull(), 0),
                                           (os.POSIX_SPAWN_DUP2, w, 1),
                                           (os.POSIX_SPAWN_DUP2, w, 2)])
    except BaseException:
        os.close(r)
        raise
    finally:
        os.close(w)
    return SpawnedShell(pid, open(r, "rb", buffering=0))


def popen_shell(argv_prefix: Sequence[str], cmd: str, env: dict[str, str], cwd: str | None,
           user: int | None, group: int | None,
           extra_groups: Sequence[int] | None) -> subprocess.Popen:
    return subprocess.Popen(
        [*argv_prefix, "/bin/bash", "-c", cmd],
        user=user,
        group=group,
        extra_groups=extra_groups,
        stdin=_devnull(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=env,
        cwd=cwd,
        start_new_session=True,
        close_fds=True,
    )


_DEVNULL: list[int] = []


def _devnull() -> int:
    """One /dev/null descriptor for every task's stdin (opening it per spawn costs time)."""
    if not _DEVNULL:
        _DEVNULL.append(os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC))
    return _DEVNULL[0]
