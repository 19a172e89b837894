"""Wipe credentials from the process's own command line at start-up, so that ``ps`` and
``/proc/PID/cmdline`` -- readable by every local user and by ``--task-user`` tasks -- no
longer show them.

``--postgres-url postgresql://jobq:PASSWORD@...`` and ``--connection-string ...AccountKey=...``
keep working (scripts and cron lines that pass them go on running); the secret parts
(core/secret_values.py) are overwritten in the kernel's argv area, found through
``/proc/self/stat`` (fields 48 and 49: arg_start, arg_end) and written through
``/proc/self/mem``.  Python's ``sys.argv`` is a copy and keeps the value for the parser.

What this does not do: the secret is readable from the moment of exec until this runs (the
interpreter's start, ~50 ms), and it stays in the shell's history, in the parent's
command line (``sh -c``, cron) and in a unit's ``ExecStart=``.  Hence the documented ways
that never put it in argv: the environment (``JOBQ_POSTGRES_URL``,
``JOBQ_CONNECTION_STRING``), the ``--config`` file, ``~/.pgpass`` (docs/security.rst).

It only ever touches this process's own argv area, and only when that area holds exactly
what ``/proc/self/cmdline`` says and a credential in it: a command run in a forked child
without exec (the tests' fork server, tests/ctl_server.py) has its parent's argv there, in
which nothing matches, and leaves it alone.  Called by the entry points (worker/main.py
``worker_entry``, ctl/main.py ``ctl_entry``; main thread, first thing).
"""

from __future__ import annotations

import sys

from .secret_values import redact

_ARG_START = 47  # 0-based index of field 48 (arg_start) of /proc/PID/stat


def _argv_area() -> tuple[int, int] | None:
    """(arg_start, arg_end) of this process, or None (no /proc, an old kernel)."""
    try:
        with open("/proc/self/stat", "rb") as fh:
            stat = fh.read()
    except OSError:
        return None
    # Field 2, the command name, may hold spaces and parentheses: count after the last ")".
    fields = stat[stat.rfind(b")") + 2:].split()
    try:
        return int(fields[_ARG_START - 2]), int(fields[_ARG_START - 1])
    except (IndexError, ValueError):
        return None


def wipe_argv_secrets(argv: list[str] | None = None) -> bool:
    """Overwrite the credentials in this process's command line, as ``ps`` shows it; True if
    it did (main thread, before any other thread starts).  ``argv`` is what to look for them
    in (default ``sys.orig_argv``): when nothing in it holds one, nothing is read."""
    args = sys.orig_argv if argv is None else argv
    if not any(redact(arg) != arg for arg in args):  # the common case: two regex searches
        return False
    area = _argv_area()
    if area is None:
        return False
    start, end = area
    try:
        with open("/proc/self/cmdline", "rb") as fh:
            cmdline = fh.read()
        with open("/proc/self/mem", "r+b", buffering=0) as mem:
            mem.seek(start)
            current = mem.read(end - start)
            # Only an area that is what the kernel shows as our command line, NUL-ended
            # (not rewritten by setproctitle): we know where each argument lies.
            if current != cmdline or not current.endswith(b"\0"):
                return False
            words = current[:-1].split(b"\0")
            # Each argument keeps its length, so that none moves and no empty argument
            # appears at the end (the kernel shows arg_end - arg_start bytes): a secret
            # becomes as many "*" as it had characters.  Its length shows; nothing else.
            wiped = [redact(w.decode("utf-8", "surrogateescape"), same_length=True).encode(
                "utf-8", "surrogateescape").ljust(len(w), b"*") for w in words]
            new = b"\0".join(wiped) + b"\0"
            if wiped == words or len(new) != len(current):  # never write past arg_end
                return False
            mem.seek(start)
            mem.write(new)
    except OSError:
        return False
    return True
