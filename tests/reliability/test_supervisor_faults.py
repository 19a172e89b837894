"""Faults on the supervisor's side: the task-log disk fills up, the metrics file cannot be
written, a task's cwd is missing.  Each gives a clear warning or failure reason, loses
nothing (the task runs, or is failed with its reason), and the worker keeps running."""

from __future__ import annotations

import contextlib
import json
import subprocess
import time
from pathlib import Path

import pytest

from supervisor.backends.sqlite.backend import SqliteBackend
from supervisor.core.task import Task
from tests.conftest import Env, Supervisor
from tests.reliability.conftest import still_works

# timing: the reliability suite runs alone
pytestmark = [pytest.mark.timing, pytest.mark.slow, pytest.mark.timeout(90)]

WORKER = ["-n", "2", "--poll-interval", "0.2", "--retry-delay", "0", "--max-attempts", "2"]


@contextlib.contextmanager
def tmpfs(path: Path, options: str):
    """A small tmpfs at ``path`` (root only), unmounted afterwards."""
    path.mkdir()
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)],
                         capture_output=True, text=True)
    if res.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root and CAP_SYS_ADMIN): "
                    f"{res.stderr.strip()}")
    try:
        yield path
    finally:
        if subprocess.run(["umount", str(path)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(path)], check=True)  # a process still in it


def _push_raw(env: Env, task: Task) -> str:
    """Push ``task`` as any producer may, without jobq-ctl's checks; its id."""
    backend = SqliteBackend(str(env.db), "default", "test-producer")
    try:
        return backend.push([task])[0]
    finally:
        backend.close()


def settled(env: Env, sup: Supervisor, timeout: float = 30.0) -> dict[str, tuple]:
    """Wait until nothing is pending or running; return id -> (status, reason)."""
    deadline = time.monotonic() + timeout
    while env.rows("SELECT id FROM jobs WHERE status IN ('pending', 'running')"):
        assert sup.proc.poll() is None, f"worker exited:\n{sup.log()[-3000:]}"
        assert time.monotonic() < deadline, f"tasks not settled:\n{sup.log()[-3000:]}"
        time.sleep(0.1)
    return {i: (s, r) for i, s, r in env.rows("SELECT id, status, reason FROM jobs")}


def test_task_log_disk_full(env):
    with tmpfs(env.tmp / "tasklogs", "size=64k") as logs:
        out = env.tmp / "done"
        # 200 KB of output fills the 64 KiB disk mid-task; the tasks after it find it full.
        big = env.push(f"seq 1 40000; echo big >> {out}")
        small = env.push(*[f"echo line-$JOBQ_TASK_ID; echo small >> {out}" for _ in range(4)])
        sup = env.supervisor(*WORKER, "--task-log-dir", str(logs))
        rows = settled(env, sup)
        assert {rows[i][0] for i in big + small} == {"succeeded"}, rows
        assert sorted(out.read_text().split()) == ["big"] + ["small"] * 4
        # Log lines are written by a listener thread: they may trail the settlement a little.
        sup.wait_log("No space left on device")
        for task_id in small:  # the output still reaches the worker's own log
            sup.wait_log(f"line-{task_id}")
        still_works(env, sup)


@pytest.mark.parametrize("where", ["missing-dir", "read-only-dir"])
def test_metrics_file_unwritable(env, where):
    with contextlib.ExitStack() as stack:
        if where == "missing-dir":
            path = env.tmp / "no" / "such" / "dir" / "jobq.prom"
        else:  # root ignores file modes: a read-only mount is what stops it
            path = stack.enter_context(tmpfs(env.tmp / "ro", "ro,size=64k")) / "jobq.prom"
        out = env.tmp / "done"
        ids = env.push(*[f"echo {n} >> {out}" for n in range(3)])
        sup = env.supervisor(*WORKER, "--metrics-file", str(path), "--metrics-interval", "0.2")
        rows = settled(env, sup)
        assert {rows[i][0] for i in ids} == {"succeeded"}
        assert sorted(out.read_text().split()) == ["0", "1", "2"]
        sup.wait_log("cannot write metrics file")
        log = sup.log()
        assert str(path) in log
        assert log.count("cannot write metrics file") <= 2, "warned more than once a minute"
        assert not path.exists()
        still_works(env, sup)


def test_task_cwd_missing(env):
    (env.tmp / "a-file").write_text("")
    missing = env.push("echo never", extra=("--cwd", str(env.tmp / "gone")))
    not_dir = env.push("echo never", extra=("--cwd", str(env.tmp / "a-file")))
    # jobq-ctl refuses a relative cwd (exit 2); another producer's message may carry one
    refused = env.ctl("push", "-c", "echo never", "--cwd", "no/such/relative/dir",
                      check=False)
    assert refused.returncode == 2 and "--cwd: must be an absolute" in refused.stderr
    relative = [_push_raw(env, Task(cmd="echo never", cwd="no/such/relative/dir"))]
    vanishing = env.tmp / "vanishing"
    vanishing.mkdir()
    # the cwd exists at push time and is gone by the time the task runs
    late = env.push("echo never", extra=("--cwd", str(vanishing)))
    vanishing.rmdir()
    ok = env.push(f"pwd > {env.tmp / 'pwd'}", extra=("--cwd", "/"))
    sup = env.supervisor(*WORKER)
    rows = settled(env, sup)
    for task_id in missing + not_dir + relative + late:
        status, reason = rows[task_id]
        assert status == "failed", rows[task_id]
        # never retried: the directory is as missing on the next attempt (issue 25)
        assert "spawn failed" in reason and "not retried; attempt 1 of 2" in reason, reason
    assert "No such file or directory" in rows[missing[0]][1]
    assert "(cwd " in rows[missing[0]][1]
    assert "Not a directory" in rows[not_dir[0]][1]
    assert rows[ok[0]][0] == "succeeded"
    assert (env.tmp / "pwd").read_text().strip() == "/"
    failed = json.loads(env.ctl("failed", "--json").stdout)
    assert {r["id"] for r in failed} == set(missing + not_dir + relative + late)
    assert "never" not in sup.log().replace("echo never", "")  # none of them ran
    still_works(env, sup)
