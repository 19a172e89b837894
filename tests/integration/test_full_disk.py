"""Transient faults are not configuration errors (issue 25, class 4): on a real full disk a
worker starting up retries until space is back, ``jobq-ctl push`` exits 1 with one line
saying the disk is full, and the read-only commands (``status``, ``size``, ``peek``,
``failed``) work on a full disk and on a read-only mount -- a tmpfs in tmp_path, filled,
freed and remounted read-only (disk.py; skipped without root).
"""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from supervisor.fleet.output.base import UNSTORED_AT_EXIT
from tests.conftest import wait_for
from tests.integration.helpers import one_error_line
from tests.integration.small_disk import SmallDisk, small_disk


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[SmallDisk]:
    with small_disk(tmp_path) as mounted:
        yield mounted


@pytest.fixture
def output_disk(tmp_path: Path) -> Iterator[SmallDisk]:
    """The small disk under the output store alone (``<db>.output``): the queue's database
    stays writable, so a worker settles its task and stops while its output cannot be
    stored (as when SQLite reuses a -wal it grew before the disk filled up)."""
    with small_disk(tmp_path, "jobq.db.output") as mounted:
        yield mounted


READERS = (("status", "--json"), ("size",), ("peek",), ("failed", "--json"))


def on_disk(env, disk: SmallDisk, served: bool = False) -> None:
    """The queue's database on the small disk; ``served``: a worker ran there once (it made
    the control store's table, which ``status`` reads too)."""
    env.db = disk.path / "jobq.db"
    if served:
        assert env.supervisor("--exit-when-empty").wait(30) == 0


def read_all(env) -> dict[str, str]:
    """The output of every read-only command (each must exit 0 without a word on stderr: no
    warning that the control store could not be read either)."""
    out = {}
    for args in READERS:
        res = env.ctl(*args, check=False)
        assert res.returncode == 0 and not res.stderr, (args, res.returncode, res.stderr)
        out[args[0]] = res.stdout
    return out


def test_ctl_on_a_full_disk(disk, env):
    on_disk(env, disk, served=True)
    (first,) = env.push("echo one")
    disk.fill()
    # a write: exit 1 (not 2, a configuration error), one line saying the disk is full
    line = one_error_line(env.ctl("push", "-c", "echo two", check=False), 1)
    assert "disk is full" in line and str(env.db) in line, line
    line = one_error_line(env.ctl("--sqlite-path", str(disk.path / "new.db"), "push",
                                  "-c", "echo two", check=False), 1)
    assert "disk is full" in line, line
    # reads work on the full disk
    out = read_all(env)
    assert json.loads(out["status"])["counts"]["pending"] == 1, out
    assert out["size"].strip() == "1"
    assert first in out["peek"]
    assert json.loads(out["failed"]) == []
    disk.free()
    env.push("echo two")
    assert env.ctl("size").stdout.strip() == "2"


def test_worker_starting_on_a_full_disk_waits_for_space(disk, env):
    on_disk(env, disk)
    (task,) = env.push("echo ran")
    disk.fill()
    sup = env.supervisor("--exit-when-empty")
    sup.wait_log("disk is full", 30)
    assert sup.proc.poll() is None, sup.log()  # not exit 2: retrying
    disk.free()
    assert sup.wait(60) == 0, sup.log()
    assert env.job(task)["status"] == "succeeded", sup.log()
    assert "backend not reachable (attempt 1)" in sup.log()


def test_read_only_mount_after_a_clean_close(disk, env):
    """No -wal, no -shm left (the last connection removed them): nothing can create the
    -shm on the read-only mount, the file alone is read."""
    on_disk(env, disk, served=True)
    ids = env.push("echo one", "echo two")
    assert not os.path.exists(str(env.db) + "-wal")
    disk.read_only()
    try:
        out = read_all(env)
        assert json.loads(out["status"])["counts"]["pending"] == 2, out
        assert out["size"].strip() == "2"
        assert all(i in out["peek"] for i in ids), out["peek"]
        # a write stays a configuration error: no restart makes this mount writable
        res = env.ctl("push", "-c", "echo three", check=False)
        assert res.returncode == 2 and "cannot be written" in res.stderr, res.stderr
    finally:
        disk.writable()


HOLDER = r'''
import os, sqlite3, sys
conn = sqlite3.connect(sys.argv[1])
conn.execute("PRAGMA wal_autocheckpoint=0")
conn.execute("SELECT COUNT(*) FROM jobs").fetchall()
print("open", flush=True)
sys.stdin.readline()
os._exit(0)  # no checkpoint: the -wal keeps its frames
'''


def test_read_only_mount_with_a_wal_left_behind(disk, env):
    """A writer that died left a -wal holding the last push: the read-only commands read
    it through the -shm (a read of the file alone would miss that task)."""
    on_disk(env, disk, served=True)
    env.push("echo one")
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(env.db)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "open\n"
        (second,) = env.push("echo two")
        assert os.path.getsize(str(env.db) + "-wal") > 0
        holder.send_signal(signal.SIGKILL)
    finally:
        holder.wait(10)
    disk.read_only()
    try:
        out = read_all(env)
        assert json.loads(out["status"])["counts"]["pending"] == 2, out
        assert out["size"].strip() == "2"
        assert second in out["peek"]
    finally:
        disk.writable()
    conn = sqlite3.connect(env.db)
    try:
        assert conn.execute("SELECT COUNT(*) FROM jobs").fetchone()[0] == 2
    finally:
        conn.close()



# Numbered lines of 1001 bytes, 4 a second (each write one pipe write, so whole lines are
# held or dropped), until the stop file appears.  The count printed goes to a file off the
# small disk.
PRINTER = r'''
import os, sys, time
progress, stop = sys.argv[1], sys.argv[2]
i = 0
while not os.path.exists(stop):
    os.write(1, b"%05d " % i + b"x" * 994 + b"\n")
    i += 1
    with open(progress + ".tmp", "w") as fh:
        fh.write(str(i))
    os.replace(progress + ".tmp", progress)
    time.sleep(0.25)
os.write(1, b"done\n")
'''
LINE = 1001
MARK = re.compile(r"^\[\.\.\. (\d+) bytes dropped: output store full \(no space left\) \.\.\.\]$")


def printed(progress: Path) -> int:
    try:
        return int(progress.read_text() or 0)
    except FileNotFoundError:
        return 0


def test_output_lost_to_a_full_disk_is_marked_where_it_was(disk, env):
    on_disk(env, disk)
    script, progress, stop = env.tmp / "printer.py", env.tmp / "progress", env.tmp / "stop"
    script.write_text(PRINTER)
    (task,) = env.push(f"{sys.executable} {script} {progress} {stop}")
    # 8 KiB held for the store, then dropped: a few seconds of this task's output
    sup = env.supervisor("--exit-when-empty", "--task-log-buffer", "8K")
    wait_for(lambda: env.ctl("logs", task).stdout.count("\n") >= 4, 30, what="stored output")
    disk.fill()
    before = printed(progress)
    sup.wait_log("output store unavailable", 30)
    wait_for(lambda: printed(progress) >= before + 24, 30, what="output printed meanwhile")
    disk.free()
    sup.wait_log("output store reachable again", 60)
    wait_for(lambda: printed(progress) >= before + 32, 30, what="output printed after")
    stop.touch()
    assert sup.wait(60) == 0, sup.log()

    lines = env.ctl("logs", task).stdout.split("\n")
    assert lines[-2:] == ["done", ""], lines[-3:]
    expect, gaps = 0, []
    for line in lines[:-2]:
        if not line:
            continue  # a marker stands on lines of its own
        mark = MARK.match(line)
        if mark:
            gaps.append(int(mark.group(1)))
            assert gaps[-1] % LINE == 0, line  # whole lines dropped: no half line stored
            expect += gaps[-1] // LINE
            continue
        # every stored line whole, once, in order: a write cut short by the full disk left
        # no part of its chunk behind for the retry to store a second time
        assert line == f"{expect:05d} " + "x" * 994, (expect, line[:80])
        expect += 1
    assert gaps, "nothing was dropped: no gap to prove"
    log = sup.log()
    for n in gaps:
        assert (f"[{task}] output store: {n} byte(s) of attempt 1's output were dropped while "
                f"the store was full") in log, log


def test_output_a_stopping_worker_could_not_store_is_marked_where_it_stops(output_disk, env):
    go = env.tmp / "go"
    (task,) = env.push(f"echo first; while [ ! -e {go} ]; do sleep 0.05; done; "
                       f"for i in 1 2 3 4 5; do printf '%01000d\\n' $i; done")
    sup = env.supervisor("--exit-when-empty")
    wait_for(lambda: env.ctl("logs", task).stdout == "first\n", 30, what="first line stored")
    output_disk.fill()
    go.touch()
    assert sup.wait(60) == 0, sup.log()
    assert env.job(task)["status"] == "succeeded"
    assert ("of task output not stored at exit (the store did not take them within 5s); a "
            "marker says so where the stored output of 1 attempt(s) stops") in sup.log()
    output_disk.free()
    res = env.ctl("logs", task)
    assert res.stdout == "first\n" + UNSTORED_AT_EXIT.format(n=5 * 1001), res.stdout[-300:]
