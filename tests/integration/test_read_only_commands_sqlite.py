"""Issue 14 on the SQLite backend: read-only commands create nothing (bug 4), an unwritable
database is a configuration error (bug 3), the JSON contract of status/failed (item 8)."""

from __future__ import annotations

import contextlib
import json
import re
import signal
import subprocess
import time

import pytest

from tests import ctl_server
from tests.conftest import command, wait_for

pytestmark = pytest.mark.timeout(90)

READ_ONLY = (["size"], ["peek"], ["status"], ["status", "--json"], ["failed"],
             ["failed", "--json"])


def _ctl(cwd, *args: str) -> subprocess.CompletedProcess:
    return ctl_server.run(command("jobq-ctl") + list(args), timeout=60, cwd=cwd)


@pytest.mark.parametrize("args", READ_ONLY, ids=" ".join)
def test_read_only_command_in_empty_directory_creates_nothing(tmp_path, args):
    res = _ctl(tmp_path, *args)
    assert res.returncode == 1, res
    assert list(tmp_path.iterdir()) == [], "a read-only command created a file"
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "jobq.db" in lines[0] and "does not exist" in lines[0], res
    assert res.stdout == ""


def test_read_only_command_on_a_file_without_a_queue(tmp_path):
    other = tmp_path / "other.db"
    other.write_bytes(b"")
    res = _ctl(tmp_path, "--sqlite-path", str(other), "size")
    assert res.returncode == 1
    assert "no jobq queue" in res.stderr
    assert other.read_bytes() == b"", "size wrote to the file"


def test_push_still_creates_the_database_and_size_reads_it(env):
    env.push("true")
    assert env.ctl("size").stdout.strip() == "1"
    assert env.ctl("status").returncode == 0


@contextlib.contextmanager
def immutable(path):
    """``chattr +i`` on path (root ignores file modes; the immutable flag stops it too)."""
    res = subprocess.run(["chattr", "+i", str(path)], capture_output=True, text=True)
    if res.returncode != 0:
        pytest.skip(f"chattr +i does not work here: {res.stderr.strip()}")
    try:
        yield
    finally:
        subprocess.run(["chattr", "-i", str(path)], check=True)


def test_unwritable_database_is_exit_2_at_start(env):
    [task] = env.push("true")
    with immutable(env.db):
        t0 = time.monotonic()
        sup = env.supervisor("--exit-when-empty")
        assert sup.wait(30) == 2
        assert time.monotonic() - t0 < 20
        log = sup.log().strip().splitlines()
    assert len(log) == 1 and "cannot be written" in log[0] and str(env.db) in log[0], log
    assert env.job(task)["status"] == "pending"


ISO = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")


def test_json_times_are_iso_utc_and_text_shows_failure_time(env):
    [bad] = env.push("exit 1", extra=("--max-attempts", "1"))
    sup = env.supervisor("--exit-when-empty", "--log-format", "json")
    assert sup.wait(30) == 4
    [record] = json.loads(env.ctl("failed", "--json").stdout)
    assert record["id"] == bad and ISO.match(record["failed_at"]), record
    text = env.ctl("failed").stdout
    assert f"failed {record['failed_at']}" in text, text
    # the summary's fields are keys of its JSON line, not only words of its message
    summary = json.loads(sup.log().strip().splitlines()[-1])
    assert summary["message"].startswith("summary:")
    assert {k: summary[k] for k in ("succeeded", "failed", "exit_status", "stop")} == {
        "succeeded": 0, "failed": 1, "exit_status": 4, "stop": "queue empty"}
    assert isinstance(summary["duration_s"], float) and summary["lock_lost"] == 0

    [running] = env.push("sleep 30")
    sup = env.supervisor()
    wait_for(lambda: env.job(running)["status"] == "running", 20, what="task running")
    status = json.loads(env.ctl("status", "--json").stdout)
    [row] = status["running"]
    assert ISO.match(row["locked_at"]) and ISO.match(row["locked_until"]), row
    assert status["note"] is None
    sup.signal(signal.SIGTERM)
    assert sup.wait(30) == 0
