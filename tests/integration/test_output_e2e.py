"""Issue 16 acceptance, end to end on a SQLite queue: real supervisors run the tasks, real
``jobq-ctl`` processes read their output and results (acceptance 1: ``logs -f`` live, started
before and while the task runs; acceptance 4: ``push --wait --follow`` and Ctrl-C).

``Follow``, ``STAMPS`` and ``check_live_follow`` are shared with the Storage Queue and Service
Bus versions of acceptance 1 (tests/azure/test_output_storage_queue.py,
tests/servicebus/test_output_servicebus.py): only how a command reaches the queue differs.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Sequence

import pytest

from tests.conftest import Env, Supervisor, command, wait_for
from tests.integration.captured import Captured

pytestmark = pytest.mark.timeout(120)

LINES = 50
# a line every 100 ms (the time it was printed), then an exit status a follower must report
STAMPS = f"for i in $(seq 1 {LINES}); do date +%s.%N; sleep 0.1; done; exit 4"
BOUND = 3.0  # s from a line's printing to its arrival at a follower (the bound)


def Follow(args: Sequence[str], env: dict[str, str], cwd: str) -> Captured:  # noqa: N802
    """A running jobq-ctl with these arguments, its output lines collected (captured.py)."""
    return Captured.start([*command("jobq-ctl"), *args], env=env, cwd=cwd)


def _lags(f: Follow, since: float = 0.0) -> list[float]:
    """For each stamp line the follower printed: arrival minus printing, for the lines
    printed after ``since`` (epoch)."""
    lags = []
    for arrived, line in f.out:
        printed = float(line)
        if printed >= since:
            lags.append(arrived - printed)
    return lags


def check_live_follow(start: Callable[..., Follow], push: Callable[[str], str],
                      worker: Callable[[], Supervisor]) -> None:
    """Acceptance 1 on any backend: ``logs -f`` started before the task starts waits, then
    shows each line within BOUND of its printing; one started while the task prints catches
    up and then does the same; both end with the exit status on stderr."""
    task_id = push(STAMPS)
    early = start("logs", "-f", task_id)
    try:
        early.wait_err(f"waiting for task {task_id} to start...", 30)
        sup = worker()
        wait_for(lambda: len(early.out) >= 5, 60, what="the early follower's first lines")
        late = start("logs", "-f", task_id)
        try:
            # the late follower is following once it printed anything: lines printed from
            # then on are held to the bound, those before were caught up from the store
            wait_for(lambda: late.out, 30, what="the late follower's first line")
            late_since = late.out[0][0]
            # the task exits 4: logs -f exits 1, by the task's outcome (issue 25)
            assert early.wait(90) == 1, early.err
            assert late.wait(30) == 1, late.err
        finally:
            late.kill()
        for f in (early, late):
            stamps = f.text().splitlines()
            assert len(stamps) == LINES and stamps == sorted(stamps), f.text()[-500:]
            assert f.err[-1] == "exit status 4", f.err
        lags = sorted(_lags(early))
        late_lags = sorted(_lags(late, late_since))
        print(f"print-to-follower lag: early follower median {lags[len(lags) // 2]:.2f}s max "
              f"{lags[-1]:.2f}s; late follower max {max(late_lags, default=0):.2f}s over "
              f"{len(late_lags)} lines")
        assert lags[-1] < BOUND, lags
        assert len(late_lags) >= 5, "the late follower saw too few live lines to judge"
        assert late_lags[-1] < BOUND, late_lags
        sup.signal(signal.SIGTERM)
        assert sup.wait(30) == 0
    finally:
        early.kill()


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
