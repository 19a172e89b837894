"""Issue 7 acceptance: signed tasks, the allow-list, the task user, resource limits, warnings.

Real supervisors on SQLite.  Every refused task's command would create a marker file: the
tests check that none exists.  The task-user tests need root (CI runs as root) and a system
user ``jobqtest`` they create when missing.
"""

from __future__ import annotations

import os
import pwd
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest

from supervisor.core.signing import load_key, sign_task
from supervisor.core.task import Task
from tests.conftest import command, marked_processes, wait_for
from tests.integration.helpers import death_time

pytestmark = pytest.mark.timeout(60)

TEST_USER = "jobqtest"
SYSTEM_PYTHON = "/usr/bin/python3"


def make_key(path: Path, mode: int = 0o600) -> Path:
    path.write_text(os.urandom(32).hex() + "\n")
    path.chmod(mode)
    return path


def set_body(env, task_id: str, task: Task) -> None:
    """Replace a pending job's body (what a writer with queue access could do)."""
    import sqlite3

    conn = sqlite3.connect(env.db, timeout=30)
    try:
        with conn:
            conn.execute("UPDATE jobs SET body=? WHERE id=?", (task.to_json(), task_id))
    finally:
        conn.close()


def run_worker(*args: str, env: dict[str, str] | None = None,
               timeout: float = 20) -> subprocess.CompletedProcess:
    """A supervisor that must stop at start (bad configuration)."""
    full = dict(os.environ)
    full.update(env or {})
    return subprocess.run(command("jobq-supervisor") + list(args), capture_output=True,
                          text=True, timeout=timeout, env=full)


# --------------------------------------------------------------------------- signatures
def test_unsigned_tampered_unknown_and_expired_tasks_are_refused_unrun(env):
    key = make_key(env.tmp / "k")
    other = make_key(env.tmp / "other")
    sign = ("--signing-key-file", str(key))
    ok, tampered, expired = env.push(f"touch {env.tmp}/ran-ok", f"touch {env.tmp}/ran-tampered",
                                     f"touch {env.tmp}/ran-expired", extra=sign)
    [unsigned] = env.push(f"touch {env.tmp}/ran-unsigned")
    [unknown] = env.push(f"touch {env.tmp}/ran-unknown", extra=("--signing-key-file", str(other)))
    body = Task.parse(env.job(tampered)["body"])
    set_body(env, tampered, Task(cmd=f"touch {env.tmp}/ran-tampered; echo evil", id=tampered,
                                 signature=body.signature))
    old = sign_task(Task(cmd=f"touch {env.tmp}/ran-expired", id=expired), load_key(str(key)),
                    time.time() - 3600, queue="default")
    set_body(env, expired, old)
    sup = env.supervisor("--exit-when-empty", *sign, "--max-task-age", "10m")
    assert sup.wait(30) == 4, sup.log()
    assert (env.tmp / "ran-ok").exists()
    for name in ("tampered", "expired", "unsigned", "unknown"):
        assert not (env.tmp / f"ran-{name}").exists(), name
    reasons = {tid: env.job(tid)["reason"] for tid in (tampered, expired, unsigned, unknown)}
    assert reasons[unsigned] == "signature invalid: no signature"
    assert reasons[tampered] == "signature invalid: tampered (MAC mismatch)"
    assert re.match(r"signature invalid: expired \(issued 36\d\ds ago, --max-task-age 600s\)$",
                    reasons[expired]), reasons[expired]
    assert reasons[unknown].startswith("signature invalid: unknown key id")
    assert all(env.job(t)["status"] == "failed" for t in reasons)
    assert env.job(ok)["status"] == "succeeded"
    log = sup.log()
    assert "summary: succeeded=1 failed=0 dead_lettered=4" in log
    assert log.count("dead-lettering it without a run") == 4


def test_key_rotation_flags_and_comma_separated_env(env):
    new, old = make_key(env.tmp / "new"), make_key(env.tmp / "old")
    for round_ in (1, 2):
        by_old = env.push(f"echo old >> {env.tmp}/out{round_}",
                          extra=("--signing-key-file", str(old)))
        by_new = env.push(f"echo new >> {env.tmp}/out{round_}",
                          extra=("--signing-key-file", str(new)))
        if round_ == 1:
            sup = env.supervisor("--exit-when-empty", "--signing-key-file", str(new),
                                 "--signing-key-file", str(old))
        else:
            sup = env.supervisor("--exit-when-empty",
                                 env={"JOBQ_SIGNING_KEY_FILE": f"{new},{old}"})
        assert sup.wait(30) == 0, sup.log()
        assert sorted((env.tmp / f"out{round_}").read_text().split()) == ["new", "old"]
        assert all(env.job(t)["status"] == "succeeded" for t in by_old + by_new)
    # once the old key is retired, its tasks are refused
    [late] = env.push(f"touch {env.tmp}/late", extra=("--signing-key-file", str(old)))
    sup = env.supervisor("--exit-when-empty", "--signing-key-file", str(new))
    assert sup.wait(30) == 4
    assert not (env.tmp / "late").exists()
    assert env.job(late)["reason"].startswith("signature invalid: unknown key id")


def test_bad_key_files_and_regex_exit_2_with_one_line(env):
    empty = env.tmp / "empty"
    empty.write_text("\n")
    cases = [
        (["--signing-key-file", str(empty)], "--signing-key-file:"),
        (["--signing-key-file", str(env.tmp / "missing")], "--signing-key-file: cannot read"),
        (["--allowed-commands", "echo ("], "--allowed-commands: invalid regular expression"),
        (["--max-task-age", "1h"], "--max-task-age: needs --signing-key-file"),
        (["--task-memory-limit", "lots"], "--task-memory-limit"),
        (["--task-user", "no-such-user-jobq"], "--task-user: no such user"),
    ]
    for args, expected in cases:
        res = run_worker("--sqlite-path", str(env.db), "--exit-when-empty", *args)
        assert res.returncode == 2, (args, res.stderr)
        lines = res.stderr.strip().splitlines()
        assert len(lines) == 1 and expected in lines[0], (args, res.stderr)
    res = env.ctl("push", "-c", "true", "--signing-key-file", str(empty), check=False)
    assert res.returncode == 2 and "is empty" in res.stderr
    assert not env.db.exists() or env.rows() == []


@pytest.mark.skipif(os.path.isdir("/run/systemd/system"), reason="systemd is init here")
def test_task_limits_option_without_systemd(env):
    """Flag, environment and INI key; systemd demanded where it is not init: exit 2."""
    ini = env.tmp / "w.ini"
    ini.write_text("task-limits = systemd\n")
    for args, extra_env in ((["--task-limits", "systemd"], None),
                            ([], {"JOBQ_TASK_LIMITS": "systemd"}),
                            (["--config", str(ini)], None)):
        res = run_worker("--sqlite-path", str(env.db), "--exit-when-empty",
                         "--task-memory-limit", "100M", *args, env=extra_env)
        assert res.returncode == 2, res.stderr
        assert res.stderr.strip().splitlines() == [
            "jobq-supervisor: error: --task-limits systemd: systemd is not the init system "
            "(no /run/systemd/system)"], res.stderr
    res = run_worker("--sqlite-path", str(env.db), env={"JOBQ_TASK_LIMITS": "cgroups"})
    assert res.returncode == 2 and "--task-limits" in res.stderr
    env.push("true")
    sup = env.supervisor("--exit-when-empty", "--task-memory-limit", "100M")
    assert sup.wait(30) == 0
    assert "task limits: rlimits via prlimit (per process)" in sup.log()


def test_allowed_commands(env):
    ok, bad = env.push(f"touch {env.tmp}/allowed", f"touch {env.tmp}/allowed; touch "
                       f"{env.tmp}/smuggled", extra=("--max-attempts", "1"))
    sup = env.supervisor("--exit-when-empty", "--allowed-commands", r"touch [\w/.-]+")
    assert sup.wait(30) == 4
    assert (env.tmp / "allowed").exists() and not (env.tmp / "smuggled").exists()
    assert env.job(ok)["status"] == "succeeded"
    assert env.job(bad)["reason"].startswith("command not allowed")


# ------------------------------------------------------------------------------- limits
def test_memory_limit_failure_names_the_limit(env):
    [tid] = env.push(f"{sys.executable} -c 'x = bytearray(500 * 1024 * 1024)'",
                     extra=("--max-attempts", "1"))
    sup = env.supervisor("--exit-when-empty", "--task-memory-limit", "100M")
    assert sup.wait(30) == 4
    row = env.job(tid)
    assert row["status"] == "failed"
    assert "memory limit 100M exceeded?" in row["reason"], row["reason"]
    assert "MemoryError" in row["output_tail"]


@pytest.mark.serial  # a CPU budget: the busy loop needs a core, not the parallel phase
def test_cpu_limit_kills_a_busy_loop(env):
    t0 = time.monotonic()
    # ulimit -c 0: SIGXCPU's default action dumps core where the system allows it
    [tid] = env.push(f"ulimit -c 0; {sys.executable} -c 'while True: pass'",
                     extra=("--max-attempts", "1"))
    sup = env.supervisor("--exit-when-empty", "--task-cpu-limit", "1")
    assert sup.wait(30) == 4
    reason = env.job(tid)["reason"]
    assert reason.startswith("cpu limit of 1s exceeded"), reason
    assert time.monotonic() - t0 < 10


def test_limits_keep_group_and_marker_semantics(env):
    """prlimit execs the shell: the pid stays the group leader and SIGTERM still reaches it."""
    [tid] = env.push("sleep 1000 & sleep 1000; true")
    sup = env.supervisor("--task-memory-limit", "1G", "--task-cpu-limit", "60",
                         "--kill-timeout", "5")
    wait_for(lambda: sum(p.name() == "sleep" for p in marked_processes()) == 2, 20,
             what="task running")
    shell = [p for p in marked_processes() if p.name() == "bash"]
    assert len(shell) == 1 and os.getpgid(shell[0].pid) == shell[0].pid
    assert shell[0].parent().pid == sup.pid  # prlimit is gone: it exec'd bash in place
    limits = Path(f"/proc/{shell[0].pid}/limits").read_text()
    assert "Max cpu time              60" in limits
    sup.signal(signal.SIGTERM)
    assert sup.wait(20) == 0
    assert env.job(tid)["status"] == "pending"  # requeued, as always on shutdown


# ------------------------------------------------------------------------- warnings
def test_start_warnings_for_root_and_world_readable_secrets(env):
    ini = env.tmp / "w.ini"
    ini.write_text("[jobq-supervisor]\nconnection-string = Endpoint=sb://x;"
                   "SharedAccessKey=NOTREAL\n")
    ini.chmod(0o644)
    key = make_key(env.tmp / "k", mode=0o644)
    # --backend sqlite: the file's Service Bus string then chooses no backend (issue 41)
    sup = env.supervisor("--exit-when-empty", "--config", str(ini), "--backend", "sqlite",
                         "--signing-key-file", str(key))
    assert sup.wait(30) == 0, sup.log()
    log = sup.log()
    assert log.count(f"{ini} holds a connection string and is readable by every user") == 1
    assert log.count(f"signing key file {key} is readable by every user") == 1
    if os.geteuid() == 0:
        assert log.count("tasks run as root (no --task-user)") == 1
    assert "NOTREAL" not in log


# ---------------------------------------------------------------------------- task user
@pytest.fixture(scope="session")
def task_user():
    if os.geteuid() != 0:
        pytest.skip("needs root (switching the task user)")
    try:
        pwd.getpwnam(TEST_USER)
    except KeyError:
        if shutil.which("useradd") is None:
            pytest.skip("useradd is not available")
        # Idempotent: another xdist worker (or another suite on this machine) may create the
        # same user at the same moment; then our useradd fails and the user is there.
        made = subprocess.run(["useradd", "--system", "--no-create-home", TEST_USER],
                              capture_output=True, text=True, timeout=30)
        try:
            return pwd.getpwnam(TEST_USER)
        except KeyError:
            raise AssertionError(f"useradd {TEST_USER} failed: {made.stderr.strip()}") from None
    return pwd.getpwnam(TEST_USER)


@pytest.fixture
def shared_dir(task_user):
    """A directory the task user can write (pytest's tmp_path is root's, mode 700)."""
    path = Path(tempfile.mkdtemp(prefix="jobq-sec-"))
    os.chown(path, task_user.pw_uid, task_user.pw_gid)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_task_runs_as_the_task_user(env, task_user, shared_dir):
    out = shared_dir / "who"
    env.push(f"id -un > {out}; echo $HOME >> {out}; echo $USER $LOGNAME >> {out}; "
             f"id -G >> {out}", extra=("--cwd", str(shared_dir)))
    sup = env.supervisor("--exit-when-empty", "--task-user", TEST_USER)
    assert sup.wait(30) == 0, sup.log()
    name, home, names, groups = out.read_text().splitlines()
    assert name == TEST_USER and home == task_user.pw_dir
    assert names == f"{TEST_USER} {TEST_USER}"
    assert "0" not in groups.split()  # root's groups were dropped
    assert "tasks run as root" not in sup.log()


def test_task_max_procs_applies_to_the_task_user(env, task_user, shared_dir):
    if not os.access(SYSTEM_PYTHON, os.X_OK):
        pytest.skip(f"{SYSTEM_PYTHON} is not there (the venv's may not be readable by the user)")
    script = shared_dir / "forks.py"
    script.write_text(
        "import os, signal, sys, time\n"
        "kids = []\n"
        "try:\n"
        "    for _ in range(20):\n"
        "        pid = os.fork()\n"
        "        if pid == 0:\n"
        "            time.sleep(30)\n"
        "            os._exit(0)\n"
        "        kids.append(pid)\n"
        "except BlockingIOError:\n"
        "    print('fork refused after', len(kids))\n"
        "for pid in kids:\n"
        "    os.kill(pid, signal.SIGKILL)\n"
        "    os.waitpid(pid, 0)\n"
        "sys.exit(0 if len(kids) < 20 else 9)\n")
    [tid] = env.push(f"{SYSTEM_PYTHON} {script}", extra=("--cwd", str(shared_dir),
                                                           "--max-attempts", "1"))
    sup = env.supervisor("--exit-when-empty", "--task-user", TEST_USER, "--task-max-procs", "5")
    assert sup.wait(30) == 0, sup.log()
    assert env.job(tid)["status"] == "succeeded"
    assert "fork refused after" in sup.log()


def _user_task_procs() -> list[psutil.Process]:
    found = []
    for p in marked_processes():
        try:
            if p.uids().real == pwd.getpwnam(TEST_USER).pw_uid:
                found.append(p)
        except psutil.NoSuchProcess:
            continue
    return found


def test_sigterm_ignoring_user_task_is_killed_on_shutdown_and_by_the_lifeline(
        env, task_user, shared_dir):
    cmd = "trap '' TERM; sleep 1000; true"  # `; true`: bash stays, ignoring TERM too
    env.push(cmd, extra=("--cwd", str(shared_dir)))
    sup = env.supervisor("--task-user", TEST_USER, "--kill-timeout", "1")
    wait_for(lambda: len(_user_task_procs()) == 2, 20, what="task running as the user")
    procs = _user_task_procs()
    sup.signal(signal.SIGTERM)
    assert sup.wait(20) == 0
    assert death_time(procs, 5) is not None
    assert "preempted (killed by SIGKILL" in sup.log()
    # the same task (requeued) and a supervisor that dies by SIGKILL: the lifeline (root) acts
    sup = env.supervisor("--task-user", TEST_USER, "--kill-timeout", "60")
    wait_for(lambda: len(_user_task_procs()) == 2, 20, what="task running again")
    procs = _user_task_procs()
    sup.signal(signal.SIGKILL)
    sup.wait(10)
    assert death_time(procs, 10) is not None, "the lifeline did not kill the user's task"


def test_task_user_needs_a_root_supervisor(task_user):
    """Started as an ordinary user, --task-user is a configuration error (exit 2, one line).

    The venv's interpreter may live where that user cannot go (/root/.pyenv): run the system
    python3 on this tree and the venv's site-packages instead, when that imports."""
    site = Path(psutil.__file__).parents[1]
    env = dict(os.environ, PYTHONPATH=f"{Path(__file__).parents[2]}:{site}")
    argv = [SYSTEM_PYTHON, "-c", "import sys; from supervisor.worker.main import worker_main; "
            "sys.exit(worker_main())", "--task-user", "nobody"]
    as_user = dict(user=task_user.pw_uid, group=task_user.pw_gid, extra_groups=[], cwd="/",
                   env=env, capture_output=True, text=True, timeout=20)
    probe = subprocess.run(argv[:2] + ["import supervisor.worker.main, psutil"], **as_user)
    if probe.returncode != 0:
        pytest.skip(f"the task user cannot import this tree: {probe.stderr.strip()[-200:]}")
    res = subprocess.run(argv, **as_user)
    assert res.returncode == 2, res.stderr
    [line] = res.stderr.strip().splitlines()
    assert "--task-user: switching to another user needs root" in line
    assert f"runs as uid {task_user.pw_uid}" in line
