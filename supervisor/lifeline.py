"""The lifeline: one helper process per supervisor that kills its tasks when it dies.

The supervisor starts ``python -m supervisor.lifeline TOKEN`` in a session of its own with a pipe
on its stdin and writes ``+PGID`` / ``-PGID`` lines as tasks start and end.  When the pipe reads
EOF -- the supervisor exited, cleanly or by SIGKILL -- the helper SIGKILLs every registered
process group and every process whose environment carries ``JOBQ_LIFELINE=TOKEN:`` (that also
catches a task spawned in the instant before it was registered, and descendants that left their
group), repeating until a pass finds nothing.  On a clean exit the supervisor has already ended
every task, so the pass finds nothing and the helper exits.

It ignores SIGTERM/SIGINT/SIGHUP: a signal to the supervisor's process group (``timeout``,
systemd) must not take the lifeline down before the supervisor has finished its shutdown.
Stdlib only, so it starts fast.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

MARKER_VAR = b"JOBQ_LIFELINE"


class Lifeline:
    """The supervisor's end of the pipe (main thread only)."""

    def __init__(self, token: str) -> None:
        self.token = token
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "supervisor.lifeline", token],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            start_new_session=True,
            close_fds=True,
        )
        self.pid = self._proc.pid
        self._pending: list[str] = []

    def register(self, pgid: int) -> None:
        self._pending.append(f"+{pgid}\n")

    def unregister(self, pgid: int) -> None:
        self._pending.append(f"-{pgid}\n")

    def flush(self) -> None:
        """Send what was registered this turn in one write (main thread, once per turn).

        A task spawned a moment before the supervisor dies and not yet sent is still found
        by the helper through the JOBQ_LIFELINE marker in its environment."""
        if not self._pending or self._proc.stdin is None:
            return
        data, self._pending = "".join(self._pending).encode("ascii"), []
        try:
            self._proc.stdin.write(data)
            self._proc.stdin.flush()
        except (BrokenPipeError, ValueError, OSError):
            pass

    def close(self, timeout: float = 5.0) -> None:
        """Clean exit: EOF lets the helper sweep once more and leave."""
        self.flush()
        if self._proc.stdin is not None:
            try:
                self._proc.stdin.close()
            except OSError:
                pass
        try:
            self._proc.wait(timeout)
        except subprocess.TimeoutExpired:  # a stuck helper must not block our exit
            self._proc.kill()


def _live_stat(pid: str) -> tuple[str, int] | None:
    """(state, pgrp) of a process, or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            data = fh.read()
    except OSError:
        return None
    fields = data[data.rindex(")") + 2:].split()
    return fields[0], int(fields[2])


def doomed_pids(token: bytes, groups: set[int]) -> list[int]:
    """Live (non-zombie) processes in a registered group or carrying our marker."""
    needle = MARKER_VAR + b"=" + token + b":"
    me = os.getpid()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        stat = _live_stat(name)
        if stat is None or stat[0] in ("Z", "X"):
            continue  # a zombie is already dead; its reaper will collect it
        if stat[1] in groups:
            found.append(int(name))
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as fh:
                if needle in fh.read():
                    found.append(int(name))
        except OSError:
            continue
    return found


def kill_everything(token: bytes, groups: set[int], budget: float = 10.0) -> int:
    """SIGKILL registered groups and marked processes until a pass finds none; return kills."""
    for pgid in groups:  # the fast first strike
        try:
            os.killpg(pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    killed = 0
    deadline = time.monotonic() + budget
    quiet_passes = 0
    while time.monotonic() < deadline and quiet_passes < 2:
        hits = 0
        for pid in doomed_pids(token, groups):
            try:
                os.kill(pid, signal.SIGKILL)
                hits += 1
            except (ProcessLookupError, PermissionError):
                pass
        killed += hits
        quiet_passes = quiet_passes + 1 if hits == 0 else 0
        if quiet_passes < 2:
            # A dying process may still fork for a moment; look again shortly.
            time.sleep(0.02)
    return killed


def main(argv: list[str]) -> int:
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    token = argv[1].encode("ascii")
    groups: set[int] = set()
    stdin = sys.stdin.buffer
    for line in iter(stdin.readline, b""):
        line = line.strip()
        if len(line) < 2 or not line[1:].isdigit():
            continue
        pgid = int(line[1:])
        if line[:1] == b"+":
            groups.add(pgid)
        elif line[:1] == b"-":
            groups.discard(pgid)
    killed = kill_everything(token, groups)
    if killed:
        sys.stderr.write(f"jobq lifeline: supervisor gone; killed {killed} leftover task "
                         "process(es) after its process groups\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
