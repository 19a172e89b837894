"""Issue 16 acceptance 1 on a Service Bus worker (the project's AMQP test broker) whose control
store (Azurite's table service) and output store (Azurite's blob service) are named by one
JOBQ_CONTROL_CONNECTION_STRING: ``jobq-ctl logs -f`` in another process shows each line
within 3 s of its printing, started before the task starts and while it prints."""

from __future__ import annotations

import os

import pytest

from tests.integration.follow import Follow, check_live_follow

pytestmark = [pytest.mark.servicebus, pytest.mark.timeout(150)]


@pytest.mark.timing  # holds each line to a 3 s lag, the late follower to 5 s of task
def test_logs_follow_is_live_on_servicebus(sb_env, stores):
    control = stores.env()
    started: list[Follow] = []

    def start(*args: str) -> Follow:
        env = {**os.environ, **sb_env._env(control)}
        started.append(Follow(["--backend", "servicebus", "--queue", sb_env.queue, *args], env,
                              str(sb_env.tmp)))
        return started[-1]

    def push(cmd: str) -> str:
        (task_id,) = sb_env.ctl("push", "--max-attempts", "1", "-c", cmd,
                                env=control).stdout.split()
        return task_id

    try:
        check_live_follow(start, push, lambda: sb_env.supervisor(env=control),
                          lines=100)  # 10 s: the late follower starts meanwhile (5 s: too few)
    finally:
        for f in started:
            f.kill()
