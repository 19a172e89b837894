"""``task_trees`` (worker/process.py) lists what left a task's process group (a ``setsid``
child) and leaves the group's members to ``killpg``: a member signalled a second time may be
what the task's own SIGTERM trap started -- its cleanup, killed half-way (seen: a trap's
``date > file`` left the file empty)."""

from __future__ import annotations

import os
import signal
import time

import psutil
import pytest

from supervisor.worker.process import TaskProcess, task_trees

pytestmark = pytest.mark.timeout(30)


def test_group_members_are_left_to_killpg_and_what_left_the_group_is_listed(tmp_path):
    ready = tmp_path / "ready"
    proc = TaskProcess.spawn(f"sleep 30 & setsid sleep 30 & sleep 0.2; touch {ready}; wait",
                             dict(os.environ), None, "jobq-test-task-trees")
    others: set[int] = set()
    try:
        deadline = time.monotonic() + 10
        while not ready.exists():
            assert time.monotonic() < deadline, "the task did not start its children"
            time.sleep(0.05)
        children = psutil.Process(proc.pid).children(recursive=True)
        members = {c.pid for c in children if os.getpgid(c.pid) == proc.pgid}
        others = {c.pid for c in children} - members
        assert members and others, (members, others)
        tree = task_trees([proc], {proc.pid})[proc.marker]
        assert others <= tree
        assert not members & tree
    finally:
        os.killpg(proc.pgid, signal.SIGKILL)
        for pid in others:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        os.waitpid(proc.pid, 0)
