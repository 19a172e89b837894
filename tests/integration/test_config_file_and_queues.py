"""Issue 25, classes 3 and 4 (configuration): the installed commands with a config file in
another directory, as a service, cron and an operator's shell run them (real processes).

* Relative paths in a config file are relative to its directory, for every path option;
  flags and environment values stay relative to the working directory.
* A queue exists once a task was pushed to it or a worker served it: size/status/peek/failed
  of another one is exit 1 naming it and the known ones; push to a queue no worker has ever
  served warns (exit 0).
* Both commands read the INI file alike: full keys only, unknown sections and broken headers
  refused, errors name the file, line and key (exit 2, one line).
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
from pathlib import Path

import psutil
import pytest

from tests.conftest import command


def run(name: str, *args: str, cwd: Path, env: dict[str, str] | None = None,
        input: str | None = None) -> subprocess.CompletedProcess[str]:
    """One of the installed commands in ``cwd``, without the caller's JOBQ_ variables."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("JOBQ_")}
    full_env.update(env or {})
    res = subprocess.run([*command(name), *args], cwd=cwd, env=full_env, text=True,
                         capture_output=True, timeout=60, input=input)
    return res


def _no_process_left(before: set[int]) -> None:
    """Nothing started by a test (a worker, its lifeline, a task) is still alive."""
    mine = {p.pid for p in psutil.Process().children(recursive=True)} - before
    assert not mine, mine


@pytest.fixture
def dirs(tmp_path: Path) -> dict[str, Path]:
    """etc/ (the config file), and two other working directories."""
    out = {name: tmp_path / name for name in ("etc", "shell", "service")}
    for path in out.values():
        path.mkdir()
    return out


def test_relative_paths_in_the_config_file_are_relative_to_its_directory(dirs):
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    etc = dirs["etc"]
    key = etc / "signing.key"
    key.write_bytes(os.urandom(32))
    key.chmod(0o600)
    ini = etc / "worker.ini"
    ini.write_text("[jobq-supervisor]\n"
                   "sqlite-path = jobq.db\n"
                   "lock-file = run/batch.lock\n"
                   "task-log-dir = tasks\n"
                   "metrics-file = jobq.prom\n"
                   "signing-key-file = signing.key\n")
    (etc / "run").mkdir()
    # an operator's shell somewhere else: the same queue as the worker's, signed with the key
    push = run("jobq-ctl", "--config", str(ini), "push", "-c", "echo from-the-task",
               cwd=dirs["shell"])
    assert push.returncode == 0, push.stderr
    task_id = push.stdout.strip()
    assert (etc / "jobq.db").exists() and not (dirs["shell"] / "jobq.db").exists()
    # the worker, as cron starts it from yet another directory, with a relative --config
    sup = run("jobq-supervisor", "--config", os.path.relpath(ini, dirs["service"]),
              "--exit-when-empty", "--metrics-interval", "0.2", cwd=dirs["service"])
    assert sup.returncode == 0, sup.stderr
    assert "succeeded=1" in sup.stderr, sup.stderr
    assert (etc / "tasks" / f"{task_id}.1.log").read_text().strip() == "from-the-task"
    assert (etc / "run" / "batch.lock").exists() and (etc / "jobq.prom").exists()
    assert sorted(p.name for p in dirs["service"].iterdir()) == []
    # the autoscaling script's read, from a third directory: the worker's database
    status = run("jobq-ctl", "--config", str(ini), "status", "--json", cwd=dirs["shell"])
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["counts"]["succeeded"] == 1
    # a flag and an environment value stay relative to the working directory
    for extra, env, made in ((["--sqlite-path", "flag.db"], {}, "flag.db"),
                             ([], {"JOBQ_SQLITE_PATH": "env.db"}, "env.db")):
        res = run("jobq-ctl", "--config", str(ini), *extra, "push", "-c", "true",
                  cwd=dirs["shell"], env=env)
        assert res.returncode == 0, res.stderr
        assert (dirs["shell"] / made).exists() and not (etc / made).exists()
    _no_process_left(before)


def test_an_absolute_path_in_the_config_file_is_kept(dirs, tmp_path):
    elsewhere = tmp_path / "var" / "jobq.db"
    elsewhere.parent.mkdir()
    ini = dirs["etc"] / "worker.ini"
    ini.write_text(f"[jobq-supervisor]\nsqlite-path = {elsewhere}\n")
    res = run("jobq-ctl", "--config", str(ini), "push", "-c", "true", cwd=dirs["shell"])
    assert res.returncode == 0, res.stderr
    assert elsewhere.exists() and not (dirs["etc"] / "jobq.db").exists()


@pytest.mark.parametrize("command_name", ["size", "status", "peek", "failed"])
def test_a_mistyped_queue_is_exit_1_naming_the_known_queues(dirs, command_name):
    db = str(dirs["etc"] / "jobq.db")
    cwd = dirs["shell"]
    assert run("jobq-ctl", "--sqlite-path", db, "push", "-c", "true", cwd=cwd).returncode == 0
    res = run("jobq-ctl", "--sqlite-path", db, command_name, "--queue", "defualt", cwd=cwd)
    assert res.returncode == 1, (res.stdout, res.stderr)
    assert res.stdout == ""
    [line] = res.stderr.splitlines()
    assert "'defualt' does not exist" in line and "its queues: default" in line, line
    assert db in line
    ok = run("jobq-ctl", "--sqlite-path", db, command_name, "--queue", "default", cwd=cwd)
    assert ok.returncode == 0, ok.stderr


def test_a_queue_exists_once_pushed_to_or_served(dirs):
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    db = str(dirs["etc"] / "jobq.db")
    cwd = dirs["shell"]

    def size(queue: str) -> subprocess.CompletedProcess[str]:
        return run("jobq-ctl", "--sqlite-path", db, "size", "--queue", queue, cwd=cwd)

    assert run("jobq-ctl", "--sqlite-path", db, "push", "-c", "true", "--queue", "pushed",
               cwd=cwd).returncode == 0
    # a worker serving a queue nothing was pushed to yet makes it exist (its size is 0)
    sup = run("jobq-supervisor", "--sqlite-path", db, "--queue", "served", "--exit-when-empty",
              cwd=cwd)
    assert sup.returncode == 0, sup.stderr
    assert (size("served").returncode, size("served").stdout) == (0, "0\n")
    # a queue whose every task was deleted still exists
    assert run("jobq-ctl", "--sqlite-path", db, "clear", "--queue", "pushed",
               cwd=cwd).stdout == "deleted 1\n"
    assert (size("pushed").returncode, size("pushed").stdout) == (0, "0\n")
    missing = size("nope")
    assert missing.returncode == 1 and "its queues: pushed, served" in missing.stderr
    _no_process_left(before)


def test_push_to_a_queue_no_worker_served_warns(dirs):
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    db = dirs["etc"] / "jobq.db"
    cwd = dirs["shell"]
    first = run("jobq-ctl", "--sqlite-path", str(db), "push", "-c", "true", cwd=cwd)
    assert first.returncode == 0 and len(first.stdout.split()) == 1
    [warning] = first.stderr.splitlines()
    assert warning.startswith("jobq-ctl: warning: no worker has ever served queue 'default'")
    assert str(db) in warning and "(served: none)" in warning
    sup = run("jobq-supervisor", "--sqlite-path", str(db), "--exit-when-empty", cwd=cwd)
    assert sup.returncode == 0 and "succeeded=1" in sup.stderr, sup.stderr
    again = run("jobq-ctl", "--sqlite-path", str(db), "push", "-c", "true", cwd=cwd)
    assert again.returncode == 0 and again.stderr == "", again.stderr
    typo = run("jobq-ctl", "--sqlite-path", str(db), "push", "-c", "true", "--queue", "defualt",
               cwd=cwd)
    assert typo.returncode == 0 and len(typo.stdout.split()) == 1
    assert "queue 'defualt'" in typo.stderr and "(served: default)" in typo.stderr
    _no_process_left(before)


def test_a_database_made_before_the_queues_table_knows_its_queues(dirs):
    """An older database (no ``queues`` table): its queues come from its jobs, served when a
    job was received, once a writer opened it."""
    db = dirs["etc"] / "jobq.db"
    cwd = dirs["shell"]
    for queue in ("ran", "waits"):
        assert run("jobq-ctl", "--sqlite-path", str(db), "push", "-c", "true", "--queue", queue,
                   cwd=cwd).returncode == 0
    conn = sqlite3.connect(db)
    try:
        conn.execute("DROP TABLE queues")
        conn.execute("UPDATE jobs SET attempt=1, status='succeeded' WHERE queue='ran'")
        conn.commit()
    finally:
        conn.close()
    # read-only, before any writer: the jobs tell
    assert run("jobq-ctl", "--sqlite-path", str(db), "size", "--queue", "waits",
               cwd=cwd).stdout == "1\n"
    assert run("jobq-ctl", "--sqlite-path", str(db), "size", "--queue", "other",
               cwd=cwd).returncode == 1
    ran = run("jobq-ctl", "--sqlite-path", str(db), "push", "-c", "true", "--queue", "ran",
              cwd=cwd)
    assert ran.returncode == 0 and ran.stderr == "", ran.stderr
    waits = run("jobq-ctl", "--sqlite-path", str(db), "push", "-c", "true", "--queue", "waits",
                cwd=cwd)
    assert waits.returncode == 0 and "(served: ran)" in waits.stderr, waits.stderr


BAD_INI = [
    # (text, what the one line must say) -- the key abbreviated, as argparse takes a flag
    ("[jobq-supervisor]\nsqlite-pa = other.db\n", "line 2: unknown key 'sqlite-pa'"),
    ("[jobq-supervisor]\nbogus = 1\n", "line 2: unknown key 'bogus'"),
    ("[jobq-supervisor]\n[jobq-ctl]\nqueue = x\n", "line 2: unknown section [jobq-ctl]"),
    ("[jobq-supervisor\nqueue = x\n", "line 1: broken section header"),
    ("[jobq-supervisor]\n\nnum-workers = many\n", "line 3: num-workers: invalid int value"),
    ("[jobq-supervisor]\nexit-when-empty = maybe\n", "line 2: exit-when-empty: expected true"),
    ("[jobq-supervisor]\nbackend = sqlit\n", "line 2: backend: invalid choice 'sqlit'"),
    ("[jobq-supervisor]\nkill-timeout = soon\n", "line 2: kill-timeout: invalid duration"),
]


@pytest.mark.parametrize("text, says", BAD_INI, ids=[s.split(": ")[1] for _, s in BAD_INI])
def test_both_commands_refuse_the_same_ini_with_one_line(dirs, text, says):
    ini = dirs["etc"] / "worker.ini"
    ini.write_text(text)
    cwd = dirs["shell"]
    for name, args in (("jobq-supervisor", ["--exit-when-empty"]), ("jobq-ctl", ["size"]),
                       ("jobq-ctl", ["push", "-c", "true"])):
        res = run(name, "--config", str(ini), *args, cwd=cwd)
        assert res.returncode == 2, (name, args, res.stderr)
        [line] = res.stderr.splitlines()
        assert line.startswith(f"{name}: error: {ini} {says}"), line
        assert "--" not in line.split(str(ini))[1], line  # not "--bogus=1"
    assert not list(cwd.iterdir()) and not (dirs["etc"] / "other.db").exists()


def test_a_value_the_worker_refuses_names_the_file_line_and_key(dirs):
    ini = dirs["etc"] / "worker.ini"
    ini.write_text("[jobq-supervisor]\nqueue = default\nnum-workers = 0\n")
    res = run("jobq-supervisor", "--config", str(ini), "--exit-when-empty", cwd=dirs["shell"])
    assert res.returncode == 2
    assert res.stderr == f"jobq-supervisor: error: {ini} line 3: num-workers: must be at " \
                         "least 1\n"
    # the same value from a flag is the flag's error
    res = run("jobq-supervisor", "--config", str(ini), "-n", "-1", cwd=dirs["shell"])
    assert res.returncode == 2 and res.stderr.startswith("jobq-supervisor: error: --num-workers")
