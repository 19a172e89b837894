"""Issue 25 class 5 on a Storage Queue (Azurite) with an Azure Table control store: a task
cancelled before any worker received it ends ``push --wait`` and ``result`` with who
cancelled it and why, once the cancel is SETTLE seconds old -- the queue cannot say whether
the task is pending, and a worker that had just received it writes its own record first --
instead of a wait that never ends."""

from __future__ import annotations

import getpass
import json
import os
import signal
import socket
import time

import pytest

from supervisor.ops.task_ends import SETTLE
from tests.conftest import command, wait_for
from tests.integration.captured import Captured

pytestmark = [pytest.mark.azure, pytest.mark.timeout(120)]

FAST = ("--control-interval", "1", "--heartbeat-interval", "1", "--poll-interval", "0.2")
WHO = f"{getpass.getuser()}@{socket.gethostname()}"


def test_a_task_cancelled_before_it_was_received_ends_the_wait(sq, table):
    _, control_env = table
    ran = sq.tmp / "ran"
    sup = sq.supervisor("--worker-id", "w-sq-vis", *FAST, env=control_env)
    env = {**os.environ, **sq.secret_env(), **control_env}
    wait = Captured.start(command("jobq-ctl") + sq.base_args() + [
        "push", "-c", f"touch {ran}", "--delay", "600s", "--wait"], env=env, cwd=sq.tmp)
    wait_for(lambda: wait.out, 30, what="the pushed id")
    task_id = wait.out[0][1].decode().strip()
    t0 = time.monotonic()
    sq.ctl("cancel", task_id, "--reason", "wrong input", env=control_env)
    assert wait.wait(SETTLE + 20) == 3, wait.err
    took = time.monotonic() - t0
    assert SETTLE - 1 <= took < SETTLE + 8, f"the wait ended {took:.1f}s after the cancel"
    (line,) = wait.err
    assert line.startswith(f"{task_id} cancelled by {WHO} at "), line
    assert line.endswith(": wrong input (before it started)"), line
    res = sq.ctl("result", task_id, "--json", env=control_env)
    [rec] = json.loads(res.stdout)
    assert (rec["state"], rec["final"], rec["cancelled_by"], rec["worker"]) == (
        "cancelled", True, WHO, "")
    assert not ran.exists()
    sup.signal(signal.SIGTERM)
    assert sup.wait(30) == 0
