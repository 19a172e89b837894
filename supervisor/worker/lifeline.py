"""The lifeline: one helper process per supervisor that kills its tasks when the supervisor
dies, and when a task's lease deadline passes while the supervisor is frozen.

The supervisor starts ``python -m supervisor.worker.lifeline [--signal S] [--kill-timeout K]
[--log-format F] TOKEN`` in a session of its own with a pipe on its stdin and the supervisor's
stderr (its log stream: what it writes there is a log line in the supervisor's ``--log-format``),
and writes one line per event, batched:

``+PGID SEQ DEADLINE EXPIRES``  a task started (``JOBQ_LIFELINE=TOKEN:SEQ``, its lease's kill
                                deadline and expiry, CLOCK_MONOTONIC seconds)
``=PGID DEADLINE EXPIRES``      a renewal succeeded: the new deadline
``!PGID``                       the supervisor saw the deadline pass itself: its watchdog acts
``-PGID``                       the task is over

**Supervisor gone** (EOF on the pipe, cleanly or by SIGKILL): the helper SIGKILLs every
registered group and every process whose environment carries ``JOBQ_LIFELINE=TOKEN:`` (also a
task spawned just before it was registered), until a pass finds nothing.

**Supervisor frozen** (SIGSTOP, a debugger, a stall of that process alone): its watchdog cannot
kill, so the helper does, at ``deadline + min(margin / 2, MAX_DELAY)`` -- after the watchdog
would have acted, so in normal operation the watchdog always wins, and still before the lease
expires.  Target and signal are the watchdog's: the task's group, every process carrying its
marker, their descendants; SIGKILL, or SIGTERM with SIGKILL ``--kill-timeout`` later.  Both
processes read CLOCK_MONOTONIC, one system-wide clock (the helper is forked from the supervisor,
so it also shares its time namespace): a deadline computed in one means the same instant in the
other.  One "lifeline" thread of the supervisor sends registrations within REGISTER_BATCH of a
start and changed deadlines every FEED_EVERY seconds, independent of the main loop (a Storage
Queue receive may hold that for seconds while the leases renew on their own threads).

It ignores every signal the supervisor catches (core/signals.py: SIGTERM, SIGINT, SIGHUP, ...): a
signal to the supervisor's process group (``timeout``, systemd) or one meant for the supervisor
must not take the lifeline down before the supervisor has finished its shutdown.
Stdlib only, so it starts fast.
"""

from __future__ import annotations

import contextlib
import functools
import os
import select
import signal
import subprocess
import sys
import threading
import time
from typing import TYPE_CHECKING, Callable

from ..core.signals import CAUGHT_SIGNALS

if TYPE_CHECKING:
    from .keeper import LeaseKeeper

MARKER_VAR = b"JOBQ_LIFELINE"
FEED_EVERY = 0.2  # the supervisor sends changed deadlines this often
REGISTER_BATCH = 0.02  # and new registrations this soon, batched over this long
MAX_DELAY = 2.0  # the helper acts at most this long after a missed deadline
KILL_BUDGET = 10.0  # a kill sweeps until a pass finds nothing, for this long at most


class Lifeline:
    """The supervisor's end of the pipe.

    Main thread: ``register``, ``unregister``, ``flush``, ``close``.  Its own "lifeline" thread
    sends registrations soon and changed deadlines every FEED_EVERY seconds."""

    def __init__(self, token: str, lock_lost_behavior: str = "sigkill",
                 kill_timeout: float = 0.0, log_format: str = "text") -> None:
        self.token = token
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "supervisor.worker.lifeline", "--signal", lock_lost_behavior,
             "--kill-timeout", repr(float(kill_timeout)), "--log-format", log_format, token],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, start_new_session=True,
            close_fds=True)
        self.pid = self._proc.pid
        self.feed = DeadlineFeed(b"\0" + MARKER_VAR + b"=" + token.encode("ascii") + b":")
        self._lock = threading.Lock()  # one writer at a time keeps the lines in order
        self._stop = threading.Event()
        from ..core.threads import start_thread  # not at the top: the helper imports this module
        self._thread = start_thread(self._run, "lifeline")

    def register(self, pgid: int, marker: str = "", keeper: LeaseKeeper | None = None) -> None:
        self.feed.register(pgid, marker, keeper)

    def unregister(self, pgid: int) -> None:
        self.feed.unregister(pgid)

    def flush(self) -> None:
        """Send what was registered this turn in one write (main thread, once per turn);
        the lifeline thread sends it soon anyway."""
        self._send(deadlines=False)

    def _run(self) -> None:
        """Send registrations soon and changed deadlines every FEED_EVERY (lifeline thread).

        A task not yet registered when the supervisor freezes would never be killed on its
        deadline (measured: a freeze right after a start hit the 0.2 s flush window 2 times in
        5), so a registration wakes this thread; waiting REGISTER_BATCH after each write keeps
        that to one write per burst of starts."""
        next_scan = time.monotonic() + FEED_EVERY
        while not self._stop.is_set():
            self.feed.wanted.wait(max(0.0, next_scan - time.monotonic()))
            self.feed.wanted.clear()
            scan = time.monotonic() >= next_scan
            if scan:
                next_scan = time.monotonic() + FEED_EVERY
            self._send(deadlines=scan)
            self._stop.wait(REGISTER_BATCH)

    def _send(self, deadlines: bool) -> None:
        # Taking and writing under one lock: a "=" line must never overtake its "+".
        with self._lock:
            data = self.feed.take(deadlines)
            if not data or self._proc.stdin is None:
                return
            try:
                self._proc.stdin.write(data)
                self._proc.stdin.flush()
            except (BrokenPipeError, ValueError, OSError):
                pass

    def close(self, timeout: float = 5.0) -> None:
        """Clean exit: EOF lets the helper sweep once more and leave (main thread).  A run that
        registered no task and left no marked process (an empty batch run) kills it instead of
        waiting for its start and its sweeps (0.1 s of such a run's 0.3 s, measured)."""
        self._stop.set()
        self.feed.wanted.set()  # it waits on this, up to FEED_EVERY: wake it now
        self._thread.join(timeout)
        if not self.feed.ever and not task_pids([self.feed.needle], set()):
            self._proc.kill()  # nothing for it to sweep
        self.flush()
        with self._lock, contextlib.suppress(OSError):
            if self._proc.stdin is not None:
                self._proc.stdin.close()
        try:
            self._proc.wait(timeout)
        except subprocess.TimeoutExpired:  # a stuck helper must not block our exit
            self._proc.kill()


class DeadlineFeed:
    """What the helper has yet to hear (main thread registers; the lifeline thread reads the
    keepers' deadlines, which their own threads write)."""

    def __init__(self, needle: bytes = b"") -> None:
        self.needle, self.ever = needle, False  # every task's marker; one was registered
        self._lock = threading.Lock()
        self.wanted = threading.Event()  # registrations wait: wake the lifeline thread
        self._pending: list[str] = []
        self._watched: dict[int, list] = {}  # pgid -> [keeper, deadline sent, "!" sent]
        # "0": no deadlines (the helper still kills at the supervisor's death) -- only for
        # scripts/bench's A/B of what the feed costs
        self.deadlines = os.environ.get("JOBQ_LIFELINE_DEADLINES") != "0"

    def register(self, pgid: int, marker: str, keeper: LeaseKeeper | None) -> None:
        """A task started, with its deadline: never known without it (main thread)."""
        seq, self.ever = marker.rpartition(":")[2], True
        if not self.wanted.is_set():  # once per batch: set() takes a Condition's lock
            self.wanted.set()
        with self._lock:
            if keeper is None or not seq or not self.deadlines:
                self._pending.append(f"+{pgid}\n")
                return
            deadline = keeper.deadline
            self._pending.append(f"+{pgid} {seq} {deadline:.3f} {keeper.expires:.3f}\n")
            self._watched[pgid] = [keeper, deadline, False]

    def unregister(self, pgid: int) -> None:
        with self._lock:
            self._pending.append(f"-{pgid}\n")
            self._watched.pop(pgid, None)

    def take(self, deadlines: bool) -> bytes:
        """The lines to send now: registrations, and with ``deadlines`` the deadlines that
        changed and the losses the supervisor saw itself (any thread)."""
        with self._lock:
            if deadlines:
                for pgid, entry in self._watched.items():
                    keeper, deadline = entry[0], entry[0].deadline
                    if deadline != entry[1]:
                        entry[1] = deadline
                        self._pending.append(f"={pgid} {deadline:.3f} {keeper.expires:.3f}\n")
                    if not entry[2] and keeper.lost():
                        entry[2] = True
                        self._pending.append(f"!{pgid}\n")
            if not self._pending:
                return b""
            data, self._pending = "".join(self._pending).encode("ascii"), []
        return data


# -- the helper process ---------------------------------------------------------------------

class Watch:
    """One registered task, as the helper sees it (no dataclass: +40 ms to start)."""

    __slots__ = ("seq", "act_at", "acted", "kill_at")

    def __init__(self, seq: bytes) -> None:
        self.seq = seq  # its marker is TOKEN:SEQ; b"" when registered without a deadline
        self.act_at = float("inf")  # when the helper acts unless told of a renewal
        self.acted = False  # the first signal went out (the watchdog's, after "!")
        self.kill_at: float | None = None  # SIGTERM was sent: SIGKILL is due then


def act_time(deadline: float, expires: float) -> float:
    """When the helper acts on a deadline: after the watchdog, before the lease expires."""
    return deadline + min(max(0.0, expires - deadline) / 2, MAX_DELAY)


class Deadlines:
    """The helper's book of tasks and deadlines (callers pass ``now``: tests inject it)."""

    def __init__(self, sig: int, kill_timeout: float) -> None:
        self.sig = sig
        self.kill_timeout = kill_timeout
        self.tasks: dict[int, Watch] = {}

    def feed(self, line: bytes, now: float) -> None:
        parts = line.split()
        if not parts or len(parts[0]) < 2 or not parts[0][1:].isdigit():
            return
        op, pgid = parts[0][:1], int(parts[0][1:])
        try:
            if op == b"+":
                watch = Watch(parts[1] if len(parts) > 1 else b"")
                if len(parts) >= 4:
                    watch.act_at = act_time(float(parts[2]), float(parts[3]))
                self.tasks[pgid] = watch
            elif op == b"-":
                self.tasks.pop(pgid, None)
            elif op == b"=" and pgid in self.tasks and not self.tasks[pgid].acted:
                self.tasks[pgid].act_at = act_time(float(parts[1]), float(parts[2]))
            elif op == b"!" and pgid in self.tasks:
                watch = self.tasks[pgid]
                if self.sig == signal.SIGTERM and not watch.acted:
                    # The watchdog sent SIGTERM: no second one from us, but SIGKILL on time
                    # should the supervisor freeze before it escalates.
                    watch.acted = True
                    if self.kill_timeout > 0:
                        watch.kill_at = max(now, watch.act_at) + self.kill_timeout
        except (IndexError, ValueError):
            return  # a torn or foreign line: ignore it, never die of it

    def due(self, now: float) -> list[tuple[int, int]]:
        """(pgid, signal) for every task whose time has come; each goes out once."""
        out = []
        for pgid, watch in self.tasks.items():
            if not watch.acted and now >= watch.act_at:
                watch.acted = True
                out.append((pgid, self.sig))
                if self.sig == signal.SIGTERM and self.kill_timeout > 0:
                    watch.kill_at = now + self.kill_timeout
            elif watch.kill_at is not None and now >= watch.kill_at:
                watch.kill_at = None
                out.append((pgid, signal.SIGKILL))
        return out

    def next_wake(self) -> float | None:
        times = [t for t in (w.kill_at if w.acted else w.act_at for w in self.tasks.values())
                 if t is not None and t != float("inf")]
        return min(times, default=None)


def _live_stat(pid: str) -> tuple[str, int, int] | None:
    """(state, ppid, pgrp) of a process, or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            data = fh.read()
    except OSError:
        return None
    fields = data[data.rindex(")") + 2:].split()
    return fields[0], int(fields[1]), int(fields[2])


def _environ(pid: str) -> bytes:
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            return b"\0" + fh.read()  # every entry now starts and ends with a NUL
    except OSError:
        return b""


def task_pids(needles: list[bytes], groups: set[int]) -> list[int]:
    """Live (non-zombie) processes in ``groups`` or whose environment holds one of
    ``needles``, and their descendants: the watchdog's target set."""
    me = os.getpid()
    children: dict[int, list[int]] = {}
    roots: set[int] = set()
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        stat = _live_stat(name)
        if stat is None or stat[0] in ("Z", "X"):
            continue  # a zombie is already dead; its reaper will collect it
        pid = int(name)
        children.setdefault(stat[1], []).append(pid)
        if stat[2] in groups:
            roots.add(pid)
        elif needles:
            env = _environ(name)  # read once, whatever the number of needles
            if any(n in env for n in needles):
                roots.add(pid)
    found, stack = set(roots), list(roots)
    while stack:
        for child in children.get(stack.pop(), ()):
            if child not in found:
                found.add(child)
                stack.append(child)
    return sorted(found)


def sweep(find: Callable[[], list[int]], groups: set[int], sig: int,
          budget: float = KILL_BUDGET) -> tuple[int, int]:
    """Signal ``groups`` at once, then what ``find`` returns until a pass finds nothing
    (SIGKILL) or once (SIGTERM: the task may be exiting, not forking); return how many
    groups and how many single processes were signalled."""
    hit_groups = 0
    for pgid in groups:  # the fast first strike
        try:
            os.killpg(pgid, sig)
            hit_groups += 1
        except (ProcessLookupError, PermissionError):
            pass
    killed = 0
    deadline = time.monotonic() + budget
    quiet_passes = 0
    while time.monotonic() < deadline and quiet_passes < 2:
        hits = 0
        for pid in find():
            try:
                os.kill(pid, sig)
                hits += 1
            except (ProcessLookupError, PermissionError):
                pass
        killed += hits
        if sig != signal.SIGKILL:
            break
        quiet_passes = quiet_passes + 1 if hits == 0 else 0
        if quiet_passes < 2:
            # A dying process may still fork for a moment; look again shortly.
            time.sleep(0.02)
    return hit_groups, killed


def kill_everything(token: bytes, groups: set[int], budget: float = KILL_BUDGET) -> int:
    """SIGKILL registered groups and marked processes until a pass finds none; return kills."""
    needles = [b"\0" + MARKER_VAR + b"=" + token + b":"]  # any task of ours
    return sweep(functools.partial(task_pids, needles, groups), groups, signal.SIGKILL,
                 budget)[1]


def say(log_format: str, message: str, **fields: object) -> None:
    """One WARNING line on the log stream, formatted as the supervisor's own lines are
    (worker/logs.py's formatters: in JSON every line is an object), written at once.  Imported here,
    not at the top: only after a kill, never on the helper's start."""
    import logging

    from .logs import JsonFormatter, TextFormatter

    record = logging.LogRecord("jobq.lifeline", logging.WARNING, "", 0, message, None, None)
    record.__dict__.update(fields)
    formatter = JsonFormatter() if log_format == "json" else TextFormatter()
    sys.stderr.write(formatter.format(record) + "\n")
    sys.stderr.flush()


def act(token: bytes, book: Deadlines, actions: list[tuple[int, int]],
        log_format: str = "text") -> None:
    """Signal the tasks whose deadline passed without word from the supervisor."""
    for sig in {s for _, s in actions}:
        targets = {p for p, s in actions if s == sig}
        needles = [b"\0" + MARKER_VAR + b"=" + token + b":" + book.tasks[p].seq + b"\0"
                   for p in targets if book.tasks[p].seq]
        groups, pids = sweep(functools.partial(task_pids, needles, targets), targets, sig)
        if groups or pids:
            say(log_format, f"lifeline: lease deadline passed with no word from the "
                f"supervisor (frozen?): sent {signal.Signals(sig).name} to the task(s) in "
                f"process group(s) {' '.join(map(str, sorted(targets)))} and {pids} "
                "process(es) of their trees", process_groups=sorted(targets), processes=pids)


def serve(token: bytes, book: Deadlines, fd: int = 0, log_format: str = "text") -> None:
    """Read the supervisor's lines, acting on deadlines between them, until EOF."""
    rest = b""
    while True:
        actions = book.due(time.monotonic())
        if actions:
            act(token, book, actions, log_format)
        wake = book.next_wake()
        timeout = None if wake is None else max(0.0, wake - time.monotonic())
        if not select.select([fd], [], [], timeout)[0]:
            continue  # a deadline came: act on it
        data = os.read(fd, 65536)
        if not data:
            return
        *lines, rest = (rest + data).split(b"\n")
        for line in lines:
            book.feed(line, time.monotonic())


def main(argv: list[str]) -> int:
    for sig in CAUGHT_SIGNALS - {signal.SIGCHLD}:  # it starts no process: SIG_IGN is fine
        signal.signal(sig, signal.SIG_IGN)
    args = argv[1:]
    options = dict(zip(args[:-1:2], args[1:-1:2]))
    token = args[-1].encode("ascii")
    sig = signal.SIGTERM if options.get("--signal") == "sigterm" else signal.SIGKILL
    book = Deadlines(sig, float(options.get("--kill-timeout", "0")))
    log_format = options.get("--log-format", "text")
    try:
        serve(token, book, log_format=log_format)
    except Exception as exc:  # never die with tasks left: sweep them as at the supervisor's end
        say(log_format, f"lifeline: unexpected error, killing every task: {exc!r}")
    if killed := kill_everything(token, set(book.tasks)):
        say(log_format, f"lifeline: supervisor gone; killed {killed} leftover task "
            "process(es) after its process groups", processes=killed)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
