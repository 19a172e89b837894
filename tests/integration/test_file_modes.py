"""Issue 39 (4): what the commands create is private to their user (core/file_modes.py):
the SQLite queue, the output store and the task logs 0600/0700 by a real worker run,
0640/0750 with --group-readable; the tasks keep the umask the worker was started with, on
both spawn paths (posix_spawn; Popen, taken for a task with a cwd).

Every command here starts under umask 0022, as a login shell or systemd's default gives."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(60)

UMASK_022 = ("/bin/sh", "-c", 'umask 0022 && exec "$@"', "sh")


def modes(root: Path) -> dict[str, int]:
    """Every path under ``root`` (itself included, as ".") with its permission bits."""
    found = {".": stat.S_IMODE(root.stat().st_mode)}
    for path in root.rglob("*"):
        found[str(path.relative_to(root))] = stat.S_IMODE(path.lstat().st_mode)
    return found


def umask_task(out: Path) -> str:
    """A task that writes its umask, creates a file of its own beside it and prints a line
    (the output store makes no file for a task that prints nothing)."""
    return f"umask > {out}.umask && touch {out}.file && echo output"


def run_worker(env, *args: str) -> None:
    sup = env.supervisor("--exit-when-empty", "--task-log-dir", "logs", *args, prefix=UMASK_022)
    assert sup.wait(30) == 0, sup.log()


def test_a_worker_run_creates_private_files_and_tasks_keep_their_umask(env):
    """The db (made by the worker here), the output store and the task logs: 0600/0700;
    a task's own file: 0644, its umask 0022, on the posix_spawn path and the Popen path."""
    tasks = env.tmp / "tasks"
    tasks.mkdir()
    tasks.chmod(0o755)
    sup = env.supervisor("--exit-when-empty", prefix=UMASK_022)
    assert sup.wait(30) == 0, sup.log()
    assert stat.S_IMODE(env.db.stat().st_mode) == 0o600
    env.push(umask_task(tasks / "plain"))
    env.push(umask_task(tasks / "cwd"), extra=("--cwd", str(tasks)))
    run_worker(env)
    assert (tasks / "plain.umask").read_text().strip() == "0022"
    assert (tasks / "cwd.umask").read_text().strip() == "0022"
    assert modes(tasks)["plain.file"] == modes(tasks)["cwd.file"] == 0o644
    output = Path(f"{env.db}.output")
    for path, mode in {**modes(output), **modes(env.tmp / "logs")}.items():
        assert mode == (0o700 if path == "." or "." not in path else 0o600), (path, oct(mode))
    assert len(modes(env.tmp / "logs")) == 3  # the directory and the two tasks' logs


def test_jobq_ctl_creates_a_private_db(env):
    env.ctl("push", "-c", "true")
    assert stat.S_IMODE(env.db.stat().st_mode) == 0o600


def test_group_readable_grants_the_group_and_task_umask_is_the_tasks(env):
    sup = env.supervisor("--exit-when-empty", "--group-readable", prefix=UMASK_022)
    assert sup.wait(30) == 0, sup.log()
    assert stat.S_IMODE(env.db.stat().st_mode) == 0o640
    out = env.tmp / "t"
    env.push(umask_task(out))
    run_worker(env, "--group-readable", "--task-umask", "0007")
    assert Path(f"{out}.umask").read_text().strip() == "0007"
    assert modes(env.tmp)["t.file"] == 0o660
    output = Path(f"{env.db}.output")
    for path, mode in {**modes(output), **modes(env.tmp / "logs")}.items():
        assert mode == (0o750 if path == "." or "." not in path else 0o640), (path, oct(mode))


def test_an_existing_database_keeps_its_mode_and_the_metrics_file_stays_readable(env):
    """An operator's chmod stands (it may be a grant); node_exporter, another user, reads the
    metrics file."""
    env.push("true")
    env.db.chmod(0o644)
    metrics = env.tmp / "jobq.prom"
    run_worker(env, "--metrics-file", str(metrics))
    assert stat.S_IMODE(env.db.stat().st_mode) == 0o644
    assert stat.S_IMODE(metrics.stat().st_mode) == 0o644
