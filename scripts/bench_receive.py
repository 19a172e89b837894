"""The SQLite receive's cost against queue depth (issue 18: receive time at 100,000 pending
tasks within 2x of at 1,000), measured on the backend directly: no worker, no spawns."""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from supervisor.backends.sqlite.backend import SqliteBackend  # noqa: E402
from supervisor.core.task import Task  # noqa: E402

_BATCH = 10_000  # tasks per push transaction while filling


def receive_time(tmp: Path, depth: int, samples: int = 300) -> float:
    """Median seconds of one ``receive(1)`` on a queue of ``depth`` pending tasks with
    mixed priorities (0..9) pushed in random-looking order, each received task settled
    before the next receive, as a worker would."""
    path = tmp / f"receive-{depth}.db"
    backend = SqliteBackend(str(path), "bench", "bench")
    try:
        for start in range(0, depth, _BATCH):
            backend.push([Task(cmd="true", priority=(i * 7919) % 10)
                          for i in range(start, min(depth, start + _BATCH))])
        times = []
        for _ in range(samples):
            t0 = time.perf_counter()
            [lease] = backend.receive(1, 60.0)
            times.append(time.perf_counter() - t0)
            lease.complete()
        return statistics.median(times)
    finally:
        backend.close()
        for suffix in ("", "-wal", "-shm"):
            Path(str(path) + suffix).unlink(missing_ok=True)
