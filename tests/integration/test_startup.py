"""Start-up: a SQLite worker and jobq-ctl import no Azure SDK and no Flask, a worker with the
control plane off none of its modules; a run that started no task does not wait for its
lifeline helper, a run that may have left a task process does.

The real entry points run in subprocesses under ``python -X importtime``, which lists every
module imported by any thread until the interpreter exits (docs/architecture.rst, "Modules":
only the backend in use is imported).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil

from supervisor.worker.lifeline import Lifeline
from tests.conftest import SESSION_TAG, command, wait_for

FOREIGN = ("azure", "flask", "werkzeug", "jinja2", "waitress", "uamqp", "psycopg", "psycopg_pool")


def imported(args: list[str], cwd, entry: str = "jobq-supervisor") -> tuple[int, set[str], str]:
    """(exit status, top-level names of every module imported, stderr without the import
    lines) of the real console script run under ``-X importtime``."""
    code, names, rest = imported_modules(args, cwd, entry)
    return code, {name.split(".")[0] for name in names}, rest


def imported_modules(args: list[str], cwd,
                     entry: str = "jobq-supervisor") -> tuple[int, set[str], str]:
    """As ``imported``, with the full name of every module imported."""
    script = command(entry)
    cmd = [sys.executable, "-X", "importtime", *(script if script[0] != sys.executable
                                                  else script[1:]), *args]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd=cwd,
                         env={**os.environ, "JOBQ_TEST_SESSION": SESSION_TAG})
    names, rest = set(), []
    for line in res.stderr.splitlines():
        if line.startswith("import time:"):
            name = line.rsplit("|", 1)[1].strip()
            names.add(name)
        else:
            rest.append(line)
    return res.returncode, names, "\n".join(rest)


def test_sqlite_worker_imports_no_azure_and_no_flask(env, tmp_path):
    env.push("echo hello", "exit 3")
    code, names, err = imported(
        ["--backend", "sqlite", "--sqlite-path", str(env.db), "--exit-when-empty",
         "--max-attempts", "1", "--task-output", "store"], tmp_path)
    assert code == 4, err  # ran both, one failed: every code path of a task was taken
    assert "succeeded=1" in err and "failed=1" in err, err
    assert "supervisor" in names and "sqlite3" in names  # the check sees our imports
    assert not names & set(FOREIGN), sorted(names & set(FOREIGN))


def test_a_worker_with_the_control_plane_off_imports_none_of_its_modules(env, tmp_path):
    """The control store's modules (records, stores, agent: ~10 ms of a cron run's start-up)
    are imported only by a worker that may use them: settlement and results (which build
    result records only for a control store) do not pull them in."""
    base = ["--backend", "sqlite", "--sqlite-path", str(env.db), "--exit-when-empty",
            "--max-attempts", "1"]
    for control, uses_it in (("off", False), ("auto", True)):
        env.push("echo hello", "exit 3")
        code, names, err = imported_modules([*base, "--control", control], tmp_path)
        assert code == 4, err  # ran both, one failed: every code path of a task was taken
        assert {"supervisor.worker.settlement", "supervisor.worker.result_log"} <= names
        control_modules = sorted(n for n in names if n.startswith("supervisor.fleet.control."))
        assert bool(control_modules) == uses_it, (control, control_modules)


def test_sqlite_ctl_imports_no_azure_and_no_flask(env, tmp_path):
    base = ["--backend", "sqlite", "--sqlite-path", str(env.db)]
    for args in (["push", "-c", "true"], ["status"], ["workers"], ["failed"]):
        code, names, err = imported([*base, *args], tmp_path, "jobq-ctl")
        assert code == 0, (args, err)
        assert not names & set(FOREIGN), (args, sorted(names & set(FOREIGN)))


# Imported by no jobq-ctl command on SQLite: the other backends' drivers, the dashboard's web
# stack, the metrics client, and shutil's compressors (argparse's help formatter would import
# shutil for the terminal's width).
NEVER_ON_SQLITE = ("azure", "psycopg", "psycopg_pool", "flask", "werkzeug", "waitress",
                   "prometheus_client", "supervisor.dashboard", "supervisor.backends.postgres",
                   "supervisor.backends.storage_queue", "supervisor.backends.servicebus",
                   "lzma", "bz2")
# The stores and command modules a command uses are imported for it alone (ctl/commands.py's
# table): what each of these commands must not pull in.
UNUSED_BY = {
    ("--help",): ("supervisor.fleet.control", "supervisor.fleet.output", "supervisor.ops.follow",
                  "supervisor.ops.fleet", "supervisor.ops.queue", "supervisor.ops.task_list",
                  "supervisor.backends.sqlite", "supervisor.ctl.queue_commands",
                  "supervisor.ctl.fleet_commands", "sqlite3"),
    ("size",): ("supervisor.fleet.control", "supervisor.fleet.output", "supervisor.ops.follow",
                "supervisor.ops.task_list",
                "supervisor.ctl.fleet_commands", "supervisor.ctl.output_commands",
                "supervisor.ctl.queue_commands", "supervisor.ctl.migrate_command"),
    ("push", "-c", "true"): ("supervisor.fleet.control", "supervisor.fleet.output",
                             "supervisor.ops.follow", "supervisor.ctl.fleet_commands",
                             "supervisor.ctl.output_commands", "supervisor.ctl.result_command"),
    ("status",): ("supervisor.fleet.output", "supervisor.ops.follow",
                  "supervisor.ctl.queue_commands", "supervisor.ctl.output_commands"),
    ("logs", "ID"): ("supervisor.ctl.queue_commands", "supervisor.ctl.fleet_commands",
                     "supervisor.ctl.result_command"),
}


def test_each_ctl_command_imports_only_what_it_uses(env, tmp_path):
    """Start-up CPU of jobq-ctl is mostly imports (a test run starts it thousands of times, a
    cron script at each call): a command imports the store and command modules it uses, not
    every command's (issue 27)."""
    [task_id] = env.push("true")
    base = ["--backend", "sqlite", "--sqlite-path", str(env.db)]
    for args, unused in UNUSED_BY.items():
        argv = [task_id if a == "ID" else a for a in args]
        code, names, err = imported_modules([*base, *argv], tmp_path, "jobq-ctl")
        assert code == 0, (args, err)
        assert "supervisor.ctl.main" in names  # the check sees our imports
        loaded = sorted(n for n in names for prefix in (*NEVER_ON_SQLITE, *unused)
                        if n == prefix or n.startswith(prefix + "."))
        assert not loaded, (args, loaded)


def test_lifeline_of_a_run_without_tasks_is_not_waited_for():
    """Nothing registered and no marked process: the helper is killed at close, not left to
    start its interpreter and sweep (SIGKILL is what tells the two paths apart)."""
    lifeline = Lifeline("startup-test-" + os.urandom(4).hex())
    helper = psutil.Process(lifeline.pid)
    lifeline.close()
    assert lifeline._proc.returncode == -signal.SIGKILL
    assert not helper.is_running() or helper.status() == psutil.STATUS_ZOMBIE


def test_lifeline_sweeps_a_marked_process_never_registered():
    """A task process that carries the marker (spawned, never registered: the supervisor
    stopped in between) keeps the helper's sweep: it dies, and the helper exits 0."""
    token = "startup-test-" + os.urandom(4).hex()
    lifeline = Lifeline(token)
    task = subprocess.Popen(["sleep", "60"], start_new_session=True,
                            env={**os.environ, "JOBQ_LIFELINE": f"{token}:1",
                                 "JOBQ_TEST_SESSION": SESSION_TAG})
    try:
        wait_for(lambda: f"{token}:1".encode() in open(f"/proc/{task.pid}/environ", "rb").read(),
                 10, what="the task's environment")
        started = time.monotonic()
        lifeline.close()
        assert lifeline._proc.returncode == 0
        assert task.wait(10) == -signal.SIGKILL
        assert time.monotonic() - started < 10
    finally:
        if task.poll() is None:
            task.kill()
            task.wait(10)
