"""A spawn submitted before the worker stopped, not yet forked, never starts: its lease goes
back to the queue, attempt not counted (issue 14, bug 1)."""

from __future__ import annotations

import queue

import pytest
from test_settlement import Harness, settled

from supervisor.core.task import Task
from supervisor.worker.launch import Launcher
from supervisor.worker.metrics import Metrics
from supervisor.worker.output_pump import OutputPump
from supervisor.worker.spawner import SpawnJob
from supervisor.worker.task_guard import TaskGuard
from supervisor.worker.watchdog import Watchdog
from tests.fakes.lease import FakeLease

pytestmark = pytest.mark.timeout(30)


def test_cancelled_spawn_releases_its_lease_uncounted(tmp_path) -> None:
    h = Harness()
    events: queue.SimpleQueue = queue.SimpleQueue()
    launcher = Launcher(h.settlement.s, TaskGuard(), h.settlement,
                        Metrics(None, backend="fake", queue="q"),
                        Watchdog(kill_timeout=10.0, lock_lost_behavior="sigkill",
                                 clock=h.clock),
                        OutputPump(), events, "tok", h.clock)
    ran = tmp_path / "ran"
    lease = FakeLease(task=Task(cmd=f"touch {ran}", id="t1"))
    launcher.dispatch(lease, h.clock.now)  # submitted; the spawner threads not yet running
    [job] = launcher.starting
    launcher.cancel_starting()  # the worker stops
    launcher.start()
    try:
        back = events.get(timeout=10)
        assert isinstance(back, SpawnJob) and back is job
        assert launcher.spawned(job) is None
    finally:
        launcher.stop()
    assert not launcher.starting and job.proc is None and not ran.exists()
    assert settled(job.context.keeper) == [("release", False, 0.0)]
    assert h.settlement.counts == h.counts()
    assert h.settlement.awaiting_return["t1"][1:] == (0.0, "released")
