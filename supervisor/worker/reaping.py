"""Reaping task shells and the orphans they leave (moved out of worker/loop.py, unchanged).

Main thread only.  Shells are reaped by pid, never with ``waitpid(-1)``: a child that is not a
running shell of ours (an orphan adopted as subreaper, a helper) is left to ``reap_orphans``.
"""

from __future__ import annotations

import signal
from collections.abc import Sequence
from typing import Callable

from .process import exited_child, reap_orphans
from .watchdog import RunningTask, Watchdog

OUTPUT_GRACE = 1.0  # after the shell exits, wait this long at most for the output to close
EXTERNAL_SIGTERM_GRACE = 1.0  # a task killed by SIGTERM from outside: is a stop coming?
ORPHAN_REAP_EVERY = 5.0
ORPHAN_REAP_BUSY = 0.2


class Reaper:
    """Marks exited shells (``exited_at``) and reaps orphans now and then (main thread)."""

    def __init__(self, watchdog: Watchdog, helper_pids: Callable[[], set[int]],
                 now: float) -> None:
        self.watchdog = watchdog
        self.helper_pids = helper_pids
        self.next_orphan_reap = now + ORPHAN_REAP_EVERY

    def reap(self, now: float, active: Sequence[RunningTask], starting: bool) -> bool:
        """Reap what exited; ``starting``: spawns are in flight (their children are not
        orphans).  True if a shell exited (a slot is free)."""
        leftovers = freed = False
        shells: dict[int, RunningTask] | None = None
        while (pid := exited_child()) is not None:
            if shells is None:
                shells = {rt.proc.pid: rt for rt in active if rt.exited_at is None}
            shell = shells.pop(pid, None)
            if shell is not None and shell.proc.poll() is not None:
                exited = [shell]
            else:  # not a running shell of ours (an orphan, a helper): look at every task
                exited = [rt for rt in shells.values() if rt.proc.poll() is not None]
            for rt in exited:
                shells.pop(rt.proc.pid, None)
                rt.exited_at = now
                # Processes left in the group: the watchdog sees to them now.  Leftovers
                # that left the group are found by its next regular check (within a
                # second); waking it for every clean exit cost more than the check itself.
                leftovers = leftovers or rt.proc.group_alive()
                freed = True
            if exited != [shell]:
                break  # that child is not ours to reap now: reap_orphans sees to orphans
        # Orphans (leftovers of exited shells) are reaped soon while some are being cleaned
        # up, else now and then; not on every exit, which would cost every task a /proc read.
        busy = self.watchdog.cleanup_busy
        if busy:
            self.next_orphan_reap = min(self.next_orphan_reap, now + ORPHAN_REAP_BUSY)
        if now >= self.next_orphan_reap and not starting:
            registered = {rt.proc.pid for rt in active if rt.exited_at is None}
            reap_orphans(registered | self.helper_pids())
            self.next_orphan_reap = now + (ORPHAN_REAP_BUSY if busy else ORPHAN_REAP_EVERY)
        if leftovers:
            self.watchdog.wake()  # leftovers of exited shells
        return freed


def ready_to_settle(rt: RunningTask, now: float, running: bool) -> bool:
    """Whether an exited task may be settled now (main thread); ``running``: the worker is
    in State.RUNNING."""
    assert rt.exited_at is not None
    output_done = rt.proc.output is None or rt.proc.output.closed.is_set()
    if not output_done and now < rt.exited_at + OUTPUT_GRACE:
        return False
    rc = rt.proc.returncode
    if (rc in (-signal.SIGTERM, 128 + signal.SIGTERM) and rt.term_reason is None
            and running and now < rt.exited_at + EXTERNAL_SIGTERM_GRACE):
        return False  # killed from outside (systemd control-group): a stop may follow
    return True
