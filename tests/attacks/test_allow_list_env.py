"""Issue 39 §2: a message walks around the allow-list through its env or cwd -- no more.

A worker with ``--allowed-commands 'echo [a-z]+'`` receives ``echo hello`` with an environment
that makes bash run something else: ``BASH_ENV`` (expanded by every ``bash -c``, no file
needed), an exported function named ``echo``, ``LD_PRELOAD``; and a worker allowing ``bash
job\\.sh`` receives a ``cwd`` where the attacker's ``job.sh`` waits.  Each would create a marker
file; each is dead-lettered, never run.  Real supervisors on SQLite.
"""

from __future__ import annotations

import json
import os

import pytest

from tests.integration.test_security import make_key, set_body

pytestmark = pytest.mark.timeout(60)


def push_with_env(env, cmd: str, variables: dict[str, str], *extra: str) -> str:
    """Push ``cmd`` and then give the pending row the message's env (what any queue writer
    can do; jobq-ctl's own --env refuses names a shell cannot take)."""
    from supervisor.core.task import Task

    [tid] = env.push(cmd, extra=extra)
    body = json.loads(env.job(tid)["body"])
    kwargs = json.loads(body["kwargs"])
    kwargs["env"] = {**kwargs.get("env", {}), **variables}
    body["kwargs"] = json.dumps(kwargs)
    set_body(env, tid, Task.parse(json.dumps(body)))
    return tid


def refused(env, tid: str) -> str:
    row = env.job(tid)
    assert row["status"] == "failed", row
    assert row["attempt"] <= 1
    return row["reason"]


def test_env_that_runs_code_is_refused_under_an_allow_list(env, tmp_path):
    evil = tmp_path / "evil"
    evil.mkdir()
    marks = {name: evil / name for name in ("bash_env", "function", "preload", "path")}
    (evil / "echo").write_text(f"#!/bin/sh\ntouch {marks['path']}\n")
    (evil / "echo").chmod(0o755)
    tids = {
        "bash_env": push_with_env(env, "echo hello", {"BASH_ENV": f"$(touch {marks['bash_env']})"}),
        "function": push_with_env(env, "echo hello",
                                  {"BASH_FUNC_echo%%": f"() {{ touch {marks['function']}; }}"}),
        "preload": push_with_env(env, "echo hello", {"LD_PRELOAD": str(evil / "evil.so")}),
        "path": push_with_env(env, "/usr/bin/env echo hello", {"PATH": str(evil)}),
    }
    [fine] = env.push("echo fine", extra=("--env", "PYTHONUNBUFFERED=1", "--env", "MODE=fast"))
    sup = env.supervisor("--exit-when-empty", "--allowed-commands", r"(/usr/bin/env )?echo [a-z]+")
    assert sup.wait(30) == 4, sup.log()
    expected = {"bash_env": "BASH_ENV", "function": "BASH_FUNC_echo%%", "preload": "LD_PRELOAD",
                "path": "PATH"}
    for what, tid in tids.items():
        assert refused(env, tid) == (f"environment variable {expected[what]!r} not allowed "
                                     f"(--allowed-env)"), what
        assert not marks[what].exists(), what
    assert env.job(fine)["status"] == "succeeded"  # harmless and ordinary names pass
    assert sup.log().count("dead-lettering it without a run") == 4


def test_allowed_env_lets_a_name_through(env, tmp_path):
    [tid] = env.push("echo hello", extra=("--env", f"PYTHONPATH={tmp_path}"))
    [pattern] = env.push("echo hi", extra=("--env", "GIT_TRACE=0"))
    sup = env.supervisor("--exit-when-empty", "--allowed-commands", "echo [a-z]+",
                         "--allowed-env", "PYTHONPATH,GIT_T*")
    assert sup.wait(30) == 0, sup.log()
    assert env.job(tid)["status"] == "succeeded"
    assert env.job(pattern)["status"] == "succeeded"


def test_refused_env_adds_names(env):
    [tid] = env.push("echo hello", extra=("--env", "MY_PLUGIN=/x"))
    [harmless] = env.push("echo hi", extra=("--env", "PYTHONUNBUFFERED=1"))
    sup = env.supervisor("--exit-when-empty", "--allowed-commands", "echo [a-z]+",
                         "--refused-env", "MY_*,PYTHONUNBUFFERED")
    assert sup.wait(30) == 4, sup.log()
    assert refused(env, tid) == "environment variable 'MY_PLUGIN' not allowed (--allowed-env)"
    assert "PYTHONUNBUFFERED" in refused(env, harmless)


def test_cwd_outside_the_allowed_directories_is_refused(env, tmp_path):
    attacker = tmp_path / "attacker"
    attacker.mkdir()
    mark = tmp_path / "ran-attackers-job"
    (attacker / "job.sh").write_text(f"touch {mark}\n")
    ours = tmp_path / "jobs"
    ours.mkdir()
    (ours / "job.sh").write_text(f"touch {ours}/ran\n")
    [bad] = env.push("bash job.sh", extra=("--cwd", str(attacker)))
    [linked] = env.push("bash job.sh", extra=("--cwd", str(ours / "link")))
    os.symlink(attacker, ours / "link")  # an allowed-looking path that resolves elsewhere
    [good] = env.push("bash job.sh", extra=("--cwd", str(ours)))
    sup = env.supervisor("--exit-when-empty", "--allowed-commands", r"bash job\.sh",
                         "--allowed-cwd", f"{ours},{tmp_path}/other/*")
    assert sup.wait(30) == 4, sup.log()
    assert refused(env, bad) == f"working directory {str(attacker)!r} not allowed (--allowed-cwd)"
    assert "not allowed (--allowed-cwd)" in refused(env, linked)
    assert not mark.exists()
    assert env.job(good)["status"] == "succeeded" and (ours / "ran").exists()


def test_default_cwd_is_the_workers_own(env):
    (env.tmp / "sub").mkdir()
    [elsewhere] = env.push("echo hello", extra=("--cwd", str(env.tmp / "sub")))
    [own] = env.push("echo hi", extra=("--cwd", str(env.tmp)))
    [none] = env.push("echo ho")
    sup = env.supervisor("--exit-when-empty", "--allowed-commands", "echo [a-z]+")
    assert sup.wait(30) == 4, sup.log()
    assert "--allowed-cwd" in refused(env, elsewhere)
    assert env.job(own)["status"] == "succeeded" and env.job(none)["status"] == "succeeded"


def test_signing_alone_enforces_it_and_no_fence_leaves_env_alone(env, tmp_path):
    key = make_key(env.tmp / "k")
    mark = tmp_path / "ran-bash-env"
    [signed] = env.push("echo hello", extra=("--signing-key-file", str(key), "--env",
                                             f"BASH_ENV=$(touch {mark})"))
    sup = env.supervisor("--exit-when-empty", "--signing-key-file", str(key))
    assert sup.wait(30) == 4, sup.log()
    assert refused(env, signed) == "environment variable 'BASH_ENV' not allowed (--allowed-env)"
    assert not mark.exists()
    # No allow-list, no keys: whoever writes to the queue picks the command anyway.
    [open_] = env.push("echo hello", extra=("--env", f"BASH_ENV=$(touch {mark})"))
    sup = env.supervisor("--exit-when-empty")
    assert sup.wait(30) == 0, sup.log()
    assert env.job(open_)["status"] == "succeeded" and mark.exists()
