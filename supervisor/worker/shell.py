"""How a task's shell is started: posix_spawn where it can (glibc's through ctypes, else
``os.posix_spawn``), ``subprocess.Popen`` else.

Both start ``bash -c CMD`` as the leader of a new session, stdin on /dev/null, stdout and
stderr on one pipe.  Called on the spawner threads (worker/spawner.py) through
``TaskProcess.spawn``.
"""

from __future__ import annotations

import ctypes
import fcntl
import os
import re
import string
import subprocess
from collections.abc import Sequence
from typing import IO

from ..core.signals import CAUGHT_SIGNALS, PYTHON_IGNORED


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
# them back at their defaults, as Popen's restore_signals does.  The ones the worker catches
# (core/signals.py) are reset by exec anyway; naming them too keeps a task's dispositions default
# whatever the worker does with them.
_RESTORED_SIGNALS = tuple(sorted({*PYTHON_IGNORED, *CAUGHT_SIGNALS}))


def posix_spawn_shell(argv: list[str], env: dict[str, str]) -> SpawnedShell | None:
    """Start ``argv`` (absolute path) in a new session with stdout+stderr on a pipe, or None
    when this path does not apply (a spawner thread).  Raises OSError, ValueError.

    posix_spawn (glibc: clone(CLONE_VM|CLONE_VFORK), all in C) costs the supervisor ~0.2 ms of
    CPU per task where ``Popen`` costs ~0.5 ms (measured here, bash -c true); at hundreds of
    tasks a second that is a good part of the supervisor's own cost.  It inherits only
    inheritable descriptors, and everything Python opens is non-inheritable (PEP 446), so it
    needs no close_fds."""
    r, w = os.pipe2(os.O_CLOEXEC)
    if min(r, w) <= 2:  # stdin/stdout/stderr were closed: let Popen sort the fds out
        os.close(r)
        os.close(w)
        return None
    try:
        if _LIBC_SPAWN is not None:
            pid = _LIBC_SPAWN.spawn(argv, env, w)
        else:
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


class _LibcSpawn:
    """glibc's posix_spawn called through ctypes, which lets go of the GIL for the call.

    ``os.posix_spawn`` holds the GIL while the parent waits for the vforked child to exec
    (~0.3-1 ms for bash): every other supervisor thread stops for that long at every spawn.
    Measured with a thread probing the GIL during spawns: p90 wait 0.75-1.4 ms with
    ``os.posix_spawn``, 0.11 ms through ctypes.  The same attributes as the fallback: new
    session, _RESTORED_SIGNALS at default, empty signal mask."""

    _SETSIGDEF, _SETSIGMASK, _SETSID = 0x04, 0x08, 0x80  # glibc's spawn.h (SETSID: >= 2.26)

    def __init__(self, libc: ctypes.CDLL) -> None:
        self._libc = libc
        for name in ("posix_spawn", "posix_spawn_file_actions_init",
                     "posix_spawn_file_actions_adddup2", "posix_spawn_file_actions_destroy",
                     "posix_spawnattr_init", "posix_spawnattr_setflags",
                     "posix_spawnattr_setsigdefault", "posix_spawnattr_setsigmask",
                     "sigemptyset", "sigaddset"):
            getattr(libc, name).restype = ctypes.c_int
        # One attribute object for every spawn: posix_spawn only reads it.  Buffers are far
        # larger than glibc's structures (336 and 128 bytes on x86-64).
        self._attr = ctypes.create_string_buffer(1024)
        default, empty = ctypes.create_string_buffer(256), ctypes.create_string_buffer(256)
        self._keep = (default, empty)
        self._check(libc.posix_spawnattr_init(self._attr))
        self._check(libc.sigemptyset(default))
        for sig in _RESTORED_SIGNALS:
            self._check(libc.sigaddset(default, int(sig)))
        self._check(libc.sigemptyset(empty))
        self._check(libc.posix_spawnattr_setsigdefault(self._attr, default))
        self._check(libc.posix_spawnattr_setsigmask(self._attr, empty))
        self._check(libc.posix_spawnattr_setflags(
            self._attr, ctypes.c_short(self._SETSID | self._SETSIGDEF | self._SETSIGMASK)))

    @staticmethod
    def _check(err: int) -> None:
        if err:
            raise OSError(err if err > 0 else ctypes.get_errno(), "posix_spawn set-up failed")

    def spawn(self, argv: list[str], env: dict[str, str], out: int) -> int:
        """Start ``argv`` with stdin on /dev/null, stdout and stderr on ``out`` (a spawner
        thread).  Raises OSError, or ValueError for a string the OS cannot take -- what
        ``os.posix_spawn`` would raise."""
        args = [_c_string(a) for a in argv]
        cache = _ENV_ENTRIES
        envp = []
        for item in env.items():
            entry = cache.get(item)
            if entry is None:
                entry = _env_entry(*item)
                if len(cache) >= _ENV_CACHE_MAX:
                    cache.clear()
                cache[item] = entry
            envp.append(entry)
        c_argv = (ctypes.c_char_p * (len(args) + 1))(*args, None)
        c_envp = (ctypes.c_char_p * (len(envp) + 1))(*envp, None)
        libc = self._libc
        actions = ctypes.create_string_buffer(256)  # glibc's is 80 bytes
        self._check(libc.posix_spawn_file_actions_init(actions))
        try:
            for fd, target in ((_devnull(), 0), (out, 1), (out, 2)):
                self._check(libc.posix_spawn_file_actions_adddup2(actions, fd, target))
            pid = ctypes.c_int()
            err = libc.posix_spawn(ctypes.byref(pid), args[0], actions, self._attr,
                                   c_argv, c_envp)
        finally:
            libc.posix_spawn_file_actions_destroy(actions)
        if err:
            raise OSError(err, os.strerror(err), argv[0])
        return pid.value


# Encoded "KEY=value" entries by (key, value): nearly every variable is the same for every
# task, and encoding ~40 of them cost ~0.1 ms of GIL time per spawn.  Cleared when full (task
# ids and markers differ per task).  Dict operations are atomic under the GIL.
_ENV_ENTRIES: dict[tuple[str, str], bytes] = {}
_ENV_CACHE_MAX = 4096


def _env_entry(key: str, value: str) -> bytes:
    k = _c_string(key)
    if not k or b"=" in k:
        raise ValueError("illegal environment variable name")
    return k + b"=" + _c_string(value)


def _c_string(text: str) -> bytes:
    data = os.fsencode(text)
    if b"\0" in data:
        raise ValueError("embedded null byte")
    return data


def _libc_spawn() -> _LibcSpawn | None:
    """The ctypes path on glibc >= 2.26 (POSIX_SPAWN_SETSID), else None: os.posix_spawn."""
    try:
        name, version = os.confstr("CS_GNU_LIBC_VERSION").split()  # type: ignore[union-attr]
        if name != "glibc" or tuple(int(x) for x in version.split(".")[:2]) < (2, 26):
            return None
        return _LibcSpawn(ctypes.CDLL(None, use_errno=True))
    except (AttributeError, ValueError, OSError):
        return None


def popen_shell(argv_prefix: Sequence[str], cmd: str, env: dict[str, str], cwd: str | None,
           user: int | None, group: int | None,
           extra_groups: Sequence[int] | None, keep: Sequence[str] = ()) -> subprocess.Popen:
    """Start ``[*argv_prefix] bash -c cmd`` (a spawner thread).

    Launchers (``systemd-run``, ``prlimit``, ``setpriv``) run before the switch to the task
    user, as the supervisor's user: they must never see the task's environment, whose
    ``LD_PRELOAD`` or ``GCONV_PATH`` would run a message's code in them (as root).  They get
    ``launcher_environment`` (plus the ``keep`` names of ``env``: the task's marker, for the
    watchdog and lifeline), and the task's environment travels in a sealed memfd to
    ``ENV_PRELUDE``, a bash that runs as the task user after the switch and execs the task's
    shell with exactly that environment."""
    if not argv_prefix:
        return _popen(["/bin/bash", "-c", cmd], env, cwd, user, group, extra_groups, ())
    fd = environment_fd(env)
    try:
        outer = launcher_environment()
        outer.update((k, env[k]) for k in keep if k in env)
        return _popen([*argv_prefix, "/bin/bash", "--noprofile", "--norc", "-c", ENV_PRELUDE,
                       "jobq-env", str(fd), cmd], outer, cwd, user, group, extra_groups, (fd,))
    finally:
        os.close(fd)


def _popen(argv: list[str], env: dict[str, str], cwd: str | None, user: int | None,
           group: int | None, extra_groups: Sequence[int] | None,
           pass_fds: Sequence[int]) -> subprocess.Popen:
    return subprocess.Popen(
        argv,
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
        pass_fds=pass_fds,
    )


# Runs as ``bash --noprofile --norc -c ENV_PRELUDE jobq-env FD CMD``, with only builtins and no
# fork (a task's RLIMIT_NPROC counts the user's other processes): drops the launchers' exported
# variables (every name, listed by its first character, with the export attribute), exports
# each NUL-separated NAME=VALUE read from FD, closes FD and execs ``bash -c CMD``.  Exported
# functions (``BASH_FUNC_name%%``) are defined and exported again, as bash would import them;
# other names a shell cannot export are skipped (the supervisor drops them before, see
# environment_fd).  ``exec`` lowers SHLVL by one, so a numeric one is raised first: the task's
# shell sees the same SHLVL as without launchers.  Values are never evaluated, except an
# exported function's body, which is the task's code anyway.
_ALL_NAMES = " ".join(f"${{!{c}@}}" for c in string.ascii_letters + "_")
ENV_PRELUDE = (
    f'for v in {_ALL_NAMES}; do [[ ${{!v@a}} == *x* ]] && unset -v "$v"; done; '
    'while IFS= read -r -d "" e; do '
    'case $e in '
    'BASH_FUNC_*%%=*) n=${e%%=*}; n=${n#BASH_FUNC_}; n=${n%"%%"}; '
    'eval "$n ${e#*=}" && export -f "$n";; '
    '*) export -- "$e";; '
    'esac; done <&"$1"; '
    'fd=$1; exec {fd}<&-; '
    'case ${SHLVL-} in ""|*[!0-9]*) ;; *) SHLVL=$((10#$SHLVL + 1));; esac; '
    'unset -v e n v fd; exec /bin/bash -c "$2"'
)
# A shell can export a variable with such a name; an exported function's name is checked apart.
_SHELL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_FUNCTION_NAME = re.compile(r"BASH_FUNC_[A-Za-z0-9_.:@+-]+%%")
LAUNCHER_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"
# The supervisor's own variables a launcher may need: systemd-run --user finds the user's
# manager through these.  Nothing of a message.
_LAUNCHER_KEEPS = ("XDG_RUNTIME_DIR", "DBUS_SESSION_BUS_ADDRESS")


def launcher_environment() -> dict[str, str]:
    """The fixed environment of every launcher (any thread)."""
    env = {"PATH": LAUNCHER_PATH, "LANG": "C"}
    env.update((k, os.environ[k]) for k in _LAUNCHER_KEEPS if k in os.environ)
    return env


def environment_fd(env: dict[str, str]) -> int:
    """A sealed memfd holding ``env`` as NUL-separated NAME=VALUE entries, at offset 0 (a
    spawner thread; the caller closes it).  Names a shell cannot export are left out."""
    block = b"".join(_env_entry(k, v) + b"\0" for k, v in env.items()
                     if _SHELL_NAME.fullmatch(k) or _FUNCTION_NAME.fullmatch(k))
    fd = os.memfd_create("jobq-task-env", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        view = memoryview(block)
        while view:
            view = view[os.write(fd, view):]
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SEAL | fcntl.F_SEAL_SHRINK
                    | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE)
        os.lseek(fd, 0, os.SEEK_SET)
    except BaseException:
        os.close(fd)
        raise
    return fd


_DEVNULL: list[int] = []


def _devnull() -> int:
    """One /dev/null descriptor for every task's stdin (opening it per spawn costs time)."""
    if not _DEVNULL:
        _DEVNULL.append(os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC))
    return _DEVNULL[0]


_LIBC_SPAWN = _libc_spawn()
