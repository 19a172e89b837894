"""The ``--task-log-dir`` purge (supervisor/worker/task_logs.py) on real files in tmp_path,
aged with ``os.utime`` against an injected wall clock; the thread itself where it is under
test (its first pass, its stop)."""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from supervisor.worker import task_logs as mod
from supervisor.worker.task_logs import NAME, TaskLogDir, log_name
from tests.conftest import wait_for

pytestmark = pytest.mark.timeout(60)

DAY = 86_400.0
NOW = 1_700_000_000.0  # the injected wall clock
WEEK = 7 * DAY


def logs(path: Path, retention: float = WEEK, **kw: float) -> TaskLogDir:
    return TaskLogDir(str(path), retention, wall=lambda: NOW, **kw)


def aged(path: Path, days: float, data: str = "output\n") -> Path:
    """A file last modified ``days`` before NOW."""
    if not path.is_symlink():
        path.write_text(data)
    os.utime(path, (NOW - days * DAY, NOW - days * DAY), follow_symlinks=False)
    return path


def names(path: Path) -> set[str]:
    return {p.name for p in path.iterdir()}


def test_files_past_the_retention_go_and_younger_ones_stay(tmp_path: Path, caplog) -> None:
    aged(tmp_path / "old.1.log", 8)
    aged(tmp_path / "old.2.log", 30)
    aged(tmp_path / "young.1.log", 6.9)
    aged(tmp_path / "now.1.log", 0)
    with caplog.at_level(logging.INFO, "jobq.worker"):
        assert logs(tmp_path).purge() == 2
    assert names(tmp_path) == {"young.1.log", "now.1.log"}
    assert [r.getMessage() for r in caplog.records] == [
        "task-log-dir: deleted 2 task log(s) older than 7d"]
    assert logs(tmp_path, retention=DAY).purge() == 1  # the operator's retention
    assert names(tmp_path) == {"now.1.log"}


def test_a_running_attempts_file_stays_however_old(tmp_path: Path) -> None:
    d = logs(tmp_path)
    path = Path(d.claim("job/../1", 3))  # claimed before the pump opens it
    assert path == tmp_path / "job____1.3.log"
    aged(path, 365)  # a task silent for a year
    assert d.purge() == 0
    assert path.exists()
    again = d.claim("job/../1", 3)  # the same name twice (a duplicate delivery): both count
    d.release(again)
    assert d.purge() == 0 and path.exists()
    d.release(str(path))  # the pump closed it: old, so it goes
    assert d.purge() == 1
    assert not path.exists()


def test_only_the_workers_own_names_are_deleted(tmp_path: Path) -> None:
    outside = aged(tmp_path.parent / f"{tmp_path.name}-target.1.log", 30)
    foreign = ["notes.txt", "x.1.log.gz", "x.log", "a b.1.log", "x.one.log", ".1.log",
               "x.1.LOG", "x.-1.log", ("y" * 129) + ".1.log"]
    for name in foreign:
        aged(tmp_path / name, 30)
    (tmp_path / "link.1.log").symlink_to(outside)
    aged(tmp_path / "link.1.log", 30)
    (tmp_path / "dir.1.log").mkdir()
    os.utime(tmp_path / "dir.1.log", (NOW - 30 * DAY, NOW - 30 * DAY))
    aged(tmp_path / "ours.1.log", 30)
    assert logs(tmp_path).purge() == 1
    assert names(tmp_path) == {*foreign, "link.1.log", "dir.1.log"}
    assert outside.exists()


@given(st.text(max_size=300), st.integers(min_value=1, max_value=10**6))
def test_every_name_the_worker_makes_is_one_it_purges(task_id: str, attempt: int) -> None:
    name = log_name(task_id, attempt)
    assert NAME.fullmatch(name), name
    assert os.path.basename(name) == name


def test_retention_0_keeps_everything_and_starts_no_thread(tmp_path: Path) -> None:
    aged(tmp_path / "old.1.log", 3650)
    d = logs(tmp_path, retention=0, first=0.0)
    assert d.purge() == 0
    d.start()
    assert d._thread is None
    d.stop()
    assert names(tmp_path) == {"old.1.log"}


@contextlib.contextmanager
def undeletable(directory: Path, files: list[Path]) -> Iterator[None]:
    """The files cannot be deleted: immutable for root (which ignores modes), else a
    directory without write permission."""
    if os.geteuid() == 0:
        res = subprocess.run(["chattr", "+i", *map(str, files)], capture_output=True)
        if res.returncode:
            pytest.skip(f"chattr +i: {res.stderr.decode().strip()}")
        try:
            yield
        finally:
            subprocess.run(["chattr", "-i", *map(str, files)], check=True)
    else:
        directory.chmod(0o500)
        try:
            yield
        finally:
            directory.chmod(0o700)


def test_errors_are_one_line_per_pass_and_never_raised(tmp_path: Path, caplog) -> None:
    stuck = [aged(tmp_path / "stuck.1.log", 30), aged(tmp_path / "stuck.2.log", 30)]
    d = logs(tmp_path)
    with undeletable(tmp_path, stuck), caplog.at_level(logging.INFO, "jobq.worker"):
        assert d.purge() == 0
        assert d.purge() == 0
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2 and lines[0] == lines[1], lines
    assert lines[0].startswith("task-log-dir: could not delete 2 task log(s) older than 7d "
                               f"(first: {tmp_path}/stuck."), lines[0]
    assert lines[0].endswith("; tried again in 1h")
    assert {r.levelno for r in caplog.records} == {logging.WARNING}
    caplog.clear()
    gone = logs(tmp_path / "gone")  # the directory removed under the worker
    with caplog.at_level(logging.INFO, "jobq.worker"):
        assert gone.purge() == 0
    assert [r.getMessage() for r in caplog.records] == [
        f"task-log-dir: cannot read {tmp_path}/gone: No such file or directory; "
        "tried again in 1h"]


def test_workers_sharing_the_directory_race_without_errors(tmp_path: Path, caplog,
                                                           monkeypatch) -> None:
    """Two workers' purges over the same 2000 old files: each file deleted once, by one of
    them; the other's vanished file is no error."""
    monkeypatch.setattr(mod, "BATCH_PAUSE", 0.0)
    for i in range(2000):
        aged(tmp_path / f"t{i}.1.log", 8)
    aged(tmp_path / "young.1.log", 1)
    workers = [logs(tmp_path), logs(tmp_path)]
    counts: list[int] = []
    start = threading.Barrier(2)

    def run(d: TaskLogDir) -> None:
        start.wait(10)
        counts.append(d.purge())

    with caplog.at_level(logging.WARNING, "jobq.worker"):
        threads = [threading.Thread(target=run, args=(d,)) for d in workers]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
    assert sum(counts) == 2000
    assert names(tmp_path) == {"young.1.log"}
    assert caplog.records == []


def test_a_big_backlog_goes_in_batches_and_a_stop_ends_the_pass(tmp_path: Path,
                                                                monkeypatch) -> None:
    monkeypatch.setattr(mod, "BATCH", 10)
    monkeypatch.setattr(mod, "BATCH_PAUSE", 30.0)  # ended by the stop, never waited out
    for i in range(50):
        aged(tmp_path / f"t{i}.1.log", 8)
    d = logs(tmp_path, first=0.0)
    started = time.monotonic()
    d.start()
    wait_for(lambda: len(names(tmp_path)) == 40, timeout=20)  # one batch, then its pause
    d.stop()
    assert d._thread is not None and not d._thread.is_alive()
    assert time.monotonic() - started < 20
    assert len(names(tmp_path)) == 40 and d.passes == 1


def test_the_thread_purges_at_start_and_then_periodically(tmp_path: Path) -> None:
    aged(tmp_path / "old.1.log", 8)
    d = logs(tmp_path, first=0.0, every=0.2)
    d.start()
    try:
        wait_for(lambda: d.passes >= 1, timeout=20)
        assert names(tmp_path) == set()
        aged(tmp_path / "later.1.log", 8)  # "an hour" later
        wait_for(lambda: not names(tmp_path), timeout=20)
        assert d._thread is not None and d._thread.name == "task-log-purge"
    finally:
        d.stop()
