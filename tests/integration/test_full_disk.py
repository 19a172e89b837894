"""Transient faults are not configuration errors (issue 25, class 4): on a real full disk a
worker starting up retries until space is back, ``jobq-ctl push`` exits 1 with one line
saying the disk is full, and the read-only commands (``status``, ``size``, ``peek``,
``failed``) work on a full disk and on a read-only mount -- a tmpfs in tmp_path, filled,
freed and remounted read-only (disk.py; skipped without root).
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.helpers import one_error_line
from tests.integration.small_disk import SmallDisk, small_disk


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[SmallDisk]:
    with small_disk(tmp_path) as mounted:
        yield mounted


READERS = (("status", "--json"), ("size",), ("peek",), ("failed", "--json"))


def on_disk(env, disk: SmallDisk) -> None:
    env.db = disk.path / "jobq.db"


def read_all(env) -> dict[str, str]:
    """The output of every read-only command (each must exit 0)."""
    out = {}
    for args in READERS:
        res = env.ctl(*args, check=False)
        assert res.returncode == 0, (args, res.returncode, res.stderr)
        out[args[0]] = res.stdout
    return out


def test_ctl_on_a_full_disk(disk, env):
    on_disk(env, disk)
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
    on_disk(env, disk)
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
    on_disk(env, disk)
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

