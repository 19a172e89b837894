"""Issue 18 item 1 on SQLite, with real jobq-ctl and jobq-supervisor processes: several queues
per worker (strict and round-robin order), each queue's own failed place and pause flag,
``jobq-ctl status`` over several queues, and bad ``--queue`` input."""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.conftest import Env, command, wait_for
from tests.integration.helpers import one_usage_line


def push_to(env: Env, queue: str, cmds: list[str], *extra: str) -> list[str]:
    args = ["--queue", queue, "push", *extra]
    for c in cmds:
        args += ["-c", c]
    return env.ctl(*args).stdout.split()


def fill(env: Env, n: int) -> None:
    """``n`` tasks in ``low``, then ``n`` in ``high`` (pushed later: FIFO alone would start
    low first); each writes its queue (from the environment) and number when it starts."""
    order = env.tmp / "order"
    for queue in ("low", "high"):
        push_to(env, queue, [f'echo "$JOBQ_QUEUE_NAME {queue}{i}" >> {order}'
                             for i in range(n)])


def started(env: Env) -> list[str]:
    lines = (env.tmp / "order").read_text().split("\n")
    pairs = [line.split() for line in lines if line]
    for seen_queue, name in pairs:  # the task's own queue in its environment
        assert name.startswith(seen_queue), pairs
    return [name for _, name in pairs]


@pytest.mark.timeout(120)
def test_strict_order_starts_every_high_task_before_any_low_one(env: Env) -> None:
    fill(env, 6)
    sup = env.supervisor("--queue", "high,low", "-n", "1", "--exit-when-empty",
                         "--poll-interval", "0.2")
    assert sup.wait(100) == 0, sup.log()
    assert started(env) == [f"high{i}" for i in range(6)] + [f"low{i}" for i in range(6)]
    assert "queue=high" in sup.log() and "queue=low" in sup.log()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("slots", [1, 3])
def test_round_robin_alternates_between_the_queues(env: Env, slots: int) -> None:
    fill(env, 6)
    sup = env.supervisor("--queue", "high,low", "--queue-order", "round-robin",
                         "-n", str(slots), "--exit-when-empty", "--poll-interval", "0.2")
    assert sup.wait(100) == 0, sup.log()
    names = started(env)
    assert sorted(names) == sorted([f"high{i}" for i in range(6)] + [f"low{i}" for i in range(6)])
    if slots == 1:
        assert names == [f"{q}{i}" for i in range(6) for q in ("high", "low")], names
    else:  # several start at once: each queue's tasks are never more than 1 apart
        for k in range(1, len(names) + 1):
            highs = sum(1 for n in names[:k] if n.startswith("high"))
            assert abs(highs - (k - highs)) <= slots, names


@pytest.mark.timeout(120)
def test_failures_land_in_each_queues_own_failed_place(env: Env) -> None:
    [bad_high] = push_to(env, "high", ["echo boom-high; exit 3"])
    [bad_low] = push_to(env, "low", ["echo boom-low; exit 4"])
    push_to(env, "low", ["true"])
    sup = env.supervisor("--queue", "high,low", "-n", "2", "--exit-when-empty",
                         "--max-attempts", "1", "--poll-interval", "0.2")
    assert sup.wait(100) == 4, sup.log()  # EXIT_TASKS_FAILED: a batch with failures
    high = json.loads(env.ctl("--queue", "high", "failed", "--json").stdout)
    low = json.loads(env.ctl("--queue", "low", "failed", "--json").stdout)
    assert [r["id"] for r in high] == [bad_high], high
    assert [r["id"] for r in low] == [bad_low], low
    rows = dict((r[0], r[1]) for r in env.rows("SELECT id, queue FROM jobs"))
    assert rows[bad_high] == "high" and rows[bad_low] == "low"
    # the result records carry the queue too: each is found under its own queue
    for queue, tid in (("high", bad_high), ("low", bad_low)):
        [res] = json.loads(env.ctl("--queue", queue, "result", tid, "--json").stdout)
        assert res["state"] == "failed" and res["exit_status"] in (3, 4), res
        # and its output under its own queue's name in the output store
        logs = env.ctl("--queue", queue, "logs", tid).stdout
        assert f"boom-{queue}" in logs, logs


@pytest.mark.timeout(120)
def test_a_paused_queue_is_skipped_and_the_other_goes_on(env: Env) -> None:
    env.ctl("--queue", "high", "pause")
    [high] = push_to(env, "high", ["true"])
    [low] = push_to(env, "low", ["true"])
    sup = env.supervisor("--queue", "high,low", "-n", "1", "--poll-interval", "0.2",
                         "--control-interval", "0.5")
    wait_for(lambda: env.job(low)["status"] == "succeeded", 60)
    assert env.job(high)["status"] == "pending"
    env.ctl("--queue", "high", "resume")
    wait_for(lambda: env.job(high)["status"] == "succeeded", 60)
    # one worker record per queue
    for queue in ("high", "low"):
        data = json.loads(env.ctl("--queue", queue, "workers", "--json").stdout)
        assert len(data) == 1 and data[0]["queue"] == queue, data
    sup.stop()


def test_status_shows_each_queue(env: Env) -> None:
    push_to(env, "high", ["true", "true"])
    push_to(env, "low", ["true"])
    text = env.ctl("--queue", "high,low", "status").stdout
    assert text.index("== queue high") < text.index("== queue low"), text
    data = json.loads(env.ctl("--queue", "high,low", "status", "--json").stdout)
    assert set(data) == {"high", "low"}
    assert data["high"]["counts"]["pending"] == 2 and data["low"]["counts"]["pending"] == 1


@pytest.mark.parametrize("value,problem", [("high,,low", "empty"), ("high,low,high", "twice"),
                                           (",", "empty")])
def test_bad_queue_lists_are_one_line_exit_2(env: Env, value: str, problem: str) -> None:
    res = subprocess.run([*command("jobq-supervisor"), "--sqlite-path", str(env.db),
                          "--queue", value], capture_output=True, text=True, timeout=60)
    assert problem in one_usage_line(res, "--queue")
    assert problem in one_usage_line(env.ctl("--queue", value, "status", check=False),
                                     "--queue")


def test_other_ctl_commands_take_one_queue(env: Env) -> None:
    line = one_usage_line(env.ctl("--queue", "high,low", "push", "-c", "true", check=False),
                          "--queue")
    assert "one queue" in line
    assert not env.db.exists() or env.rows() == []


@pytest.mark.timeout(120)
def test_cancel_and_drain_through_the_second_queue(env: Env) -> None:
    [long] = push_to(env, "low", ["sleep 60"])
    sup = env.supervisor("--queue", "high,low", "-n", "1", "--poll-interval", "0.2",
                         "--control-interval", "0.5", "--worker-id", "mq-worker")
    wait_for(lambda: env.job(long)["status"] == "running", 60)
    env.ctl("--queue", "low", "cancel", long, "--grace", "0")
    wait_for(lambda: env.job(long)["status"] == "failed", 60)

    def cancelled() -> list[dict]:  # the result record is written by the control thread
        return [r for r in json.loads(env.ctl("--queue", "low", "result", long,
                                              "--json").stdout) if r["state"] == "cancelled"]
    wait_for(cancelled, 30)
    assert cancelled()[0]["final"]
    # a drain sent to the worker's record in its second queue stops the whole worker
    env.ctl("--queue", "low", "drain", "mq-worker")
    assert sup.wait(60) == 0, sup.log()
    assert "drain" in sup.log()
