"""The threads that move task output run nicer than the rest of a real supervisor, and its
tasks do not inherit that (core/threads.py ``BULK_NICE``; docs/architecture.rst, "Threads").

Beside an output flood on 2 cores the renewals waited for a core behind the output pump, the
log writer and the output-store thread; niced, those three yield it.  Read from /proc: a
thread's nice value is field 19 of /proc/PID/task/TID/stat."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import pytest

from supervisor.core.threads import BULK_NICE
from tests.conftest import Env, wait_for

pytestmark = [pytest.mark.timeout(60),
              pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux /proc")]


def nice_values(pid: int) -> list[int]:
    """The nice value of each of the process's threads."""
    values = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            stat = (task / "stat").read_text()
        except OSError:  # the thread ended meanwhile
            continue
        values.append(int(stat.rpartition(")")[2].split()[16]))
    return values


def test_output_threads_are_niced_and_tasks_are_not(env: Env) -> None:
    env.push("nice > nice.txt; echo printed; sleep 30")
    sup = env.supervisor("-n", "1")
    wait_for(lambda: (env.tmp / "nice.txt").exists() and (env.tmp / "nice.txt").read_text(),
             30, what="the task's nice value")
    # The pump, the log writer and the output-store thread (output is stored beside a SQLite
    # queue by default); the main loop, the keeper, the watchdog... stay as the process is
    # (as this test's own: the suite may run under nice).
    base = os.getpriority(os.PRIO_PROCESS, 0)
    bulk = min(19, base + BULK_NICE)
    wait_for(lambda: nice_values(sup.pid).count(bulk) == 3, 30, what="three niced threads")
    values = nice_values(sup.pid)
    assert values.count(base) >= 4, values
    assert set(values) == {base, bulk}, values
    # spawned by a spawner thread
    assert int((env.tmp / "nice.txt").read_text()) == base
    sup.signal(signal.SIGTERM)
    assert sup.wait(30) == 0
