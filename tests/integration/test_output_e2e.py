"""Issue 16 acceptance, end to end on a SQLite queue: real supervisors run the tasks, real
``jobq-ctl`` processes read their output and results (acceptance 1: ``logs -f`` live, started
before and while the task runs; acceptance 4: ``push --wait --follow`` and Ctrl-C).

``Follow`` and ``check_live_follow`` (tests/integration/follow.py) are shared with the Storage
Queue and Service Bus versions of acceptance 1.
"""

from __future__ import annotations

import os
import signal

import pytest

from tests.conftest import Env, wait_for
from tests.integration.follow import Follow, check_live_follow

pytestmark = pytest.mark.timeout(120)


# --------------------------------------------------------------------------------- SQLite
def _ctl_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("JOBQ_")}


@pytest.fixture
def start(env: Env):
    started: list[Follow] = []

    def run(*args: str) -> Follow:
        started.append(Follow([*env.base_args(), *args], _ctl_env(), str(env.tmp)))
        return started[-1]

    yield run
    for f in started:
        f.kill()


@pytest.mark.timing  # holds each line to a 3 s lag, the late follower to 5 s of task
def test_logs_follow_is_live_on_sqlite(env, start):
    check_live_follow(
        start, lambda cmd: env.push(cmd, extra=("--max-attempts", "1"))[0],
        lambda: env.supervisor("--poll-interval", "0.2"))


def test_push_wait_follow_prints_both_outputs_and_exits_1(env, start):
    sup = env.supervisor("--poll-interval", "0.2")
    sup.wait_log("started", 30)
    push = start("push", "--wait", "--follow", "--max-attempts", "1",
                 "-c", "echo ok-out; exit 0", "-c", "echo bad-out; exit 3")
    assert push.wait(90) == 1, push.err
    lines = push.text().splitlines()
    ok, bad = lines[:2]  # the ids first, as a plain push prints them
    assert sorted(lines[2:]) == sorted([f"{ok}: ok-out", f"{bad}: bad-out"]), lines
    # --follow also ends each task's output with its own "<id>: exit status N" line
    results = [line for line in push.err if line.startswith((f"{ok} ", f"{bad} "))]
    assert sorted(results) == sorted([f"{ok} succeeded", f"{bad} failed: exit status 3"]), \
        push.err
    assert env.job(ok)["status"] == "succeeded" and env.job(bad)["status"] == "failed"
    sup.signal(signal.SIGTERM)
    assert sup.wait(30) == 0


def test_ctrl_c_on_push_wait_leaves_the_task_running_to_success(env, start):
    release, running = env.tmp / "release", env.tmp / "running"
    sup = env.supervisor("--poll-interval", "0.2")
    sup.wait_log("started", 30)
    push = start("push", "--wait", "-c", f"touch {running}; echo long-out; "
                 f"while [ ! -e {release} ]; do sleep 0.1; done; echo done-out")
    wait_for(lambda: push.out, 30, what="the pushed id")
    task_id = push.text().split()[0]
    wait_for(running.exists, 30, what="the task running on the worker")
    push.proc.send_signal(signal.SIGINT)
    assert push.wait(30) == 130, push.err
    assert push.err[-1] == f"stopped waiting; the tasks go on: {task_id}", push.err
    assert not any("Traceback" in line for line in push.err), push.err
    assert env.job(task_id)["status"] == "running"
    release.touch()
    wait_for(lambda: env.job(task_id)["status"] == "succeeded", 30, what="the task's success")
    # the worker stores output within ~2 s of its printing: the row may settle first
    wait_for(lambda: env.ctl("logs", task_id).stdout == "long-out\ndone-out\n", 30,
             what=f"the task's whole output stored ({env.ctl('logs', task_id, check=False)})")
    assert env.job(task_id)["attempt"] == 1
    assert sup.log().count("started pid=") == 1
    sup.signal(signal.SIGTERM)
    assert sup.wait(30) == 0
