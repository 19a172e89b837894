"""A spawn cancelled before its fork (the worker stopped) comes back unforked."""

from __future__ import annotations

import queue

import pytest

from supervisor.worker.spawner import Spawner, SpawnJob

pytestmark = pytest.mark.timeout(30)


def test_cancelled_job_is_handed_back_unforked():
    done: queue.SimpleQueue[SpawnJob[str]] = queue.SimpleQueue()
    spawner: Spawner[str] = Spawner(1, on_done=done.put)
    job = SpawnJob("echo should-not-run", {}, None, "marker", context="ctx")
    job.cancelled = True
    spawner.submit(job)  # queued before the thread starts: it sees the flag first
    spawner.start()
    try:
        back = done.get(timeout=10)
    finally:
        spawner.stop()
    assert back is job and job.done.is_set()
    assert job.proc is None and job.error is None
