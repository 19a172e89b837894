"""Issue 14: the installed commands, as a new operator runs them (real processes)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

BIN = Path(sys.executable).parent


def run(cmd: str, *args: str, cwd: Path, env: dict[str, str] | None = None,
        timeout: float = 60) -> subprocess.CompletedProcess[str]:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("JOBQ_")}
    full_env.update(env or {})
    return subprocess.run([str(BIN / cmd), *args], cwd=cwd, env=full_env, text=True,
                          capture_output=True, timeout=timeout)


def test_jobq_config_missing_file_is_exit_2_on_both_commands(tmp_path):
    env = {"JOBQ_CONFIG": str(tmp_path / "nonexistent.ini")}
    for cmd, args in (("jobq-supervisor", ["--exit-when-empty"]), ("jobq-ctl", ["size"])):
        res = run(cmd, *args, cwd=tmp_path, env=env)
        assert res.returncode == 2, (cmd, res.stderr)
        assert len(res.stderr.splitlines()) == 1 and "nonexistent.ini" in res.stderr
    assert not (tmp_path / "jobq.db").exists()


def test_jobq_config_values_apply_to_the_worker(tmp_path):
    ini = tmp_path / "w.ini"
    ini.write_text("[jobq-supervisor]\nnum-workers = 2\n")
    res = run("jobq-supervisor", "--exit-when-empty", cwd=tmp_path,
              env={"JOBQ_CONFIG": str(ini)})
    assert res.returncode == 0, res.stderr
    assert "slots=2" in res.stderr


def test_a_message_env_cannot_override_the_task_id(tmp_path):
    """A message written by someone else (not jobq-ctl, which refuses it) with its own
    JOBQ_TASK_ID: the task sees its real id."""
    from supervisor.backends.sqlite.backend import SqliteBackend
    from supervisor.core.task import Task

    backend = SqliteBackend(str(tmp_path / "jobq.db"), "default", "test")
    try:
        [task_id] = backend.push([Task(cmd="echo $JOBQ_TASK_ID $JOBQ_ATTEMPT > seen.txt",
                                       env={"JOBQ_TASK_ID": "forged", "JOBQ_ATTEMPT": "99"})])
    finally:
        backend.close()
    res = run("jobq-supervisor", "--exit-when-empty", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert (tmp_path / "seen.txt").read_text().split() == [task_id, "1"]
