"""Issue 26, section 1, on a Storage Queue worker: the queue endpoint is black-holed (a
loopback FaultProxy) while tasks finish, for longer than the first settlement back-off steps
but shorter than the lease.  The settlements are retried inside the lease, the lease renewed
while they wait, and once the service answers the deletes go through: every task runs
exactly once (each run appends its task id to a file), and each task's one result record
says succeeded.

Timeline, from the black-hole (``B``; the tasks were received just before it and end at
once): the worker's receive hangs until its 5-s read timeout, so the settlements start about
B+5; the deadline is about B+35.5 (a 40-s visibility timeout, 10 % margin, no renewal yet).
The old schedule tried at B+5, +11, +18, +27 (each try hangs 5 s) and then waited for the
deadline, never trying again: a service back anywhere in (B+27, B+35.5) cost every task a
second run, its first recorded as "refused".  The proxy opens at B+31, and its held
connections are reset first, like packets dropped in an outage (a black-holed request must
not arrive late and settle the task by itself).
"""

from __future__ import annotations

import json
import signal
import time

import pytest

from tests.azurite import ACCOUNT
from tests.conftest import wait_for
from tests.faults.proxy import FaultProxy

pytestmark = [pytest.mark.azure, pytest.mark.timeout(180)]

TASKS = 2
OUTAGE = 31.0  # s: > the first back-off steps (1+2+4 s and their hung calls), < the lease
LEASE = ("--visibility-timeout", "40", "--renew-interval", "15", "--poll-interval", "0.2")


def test_settlements_ride_out_a_black_holed_queue_and_every_task_runs_once(
        sq, azurite_table):
    table = f";TableEndpoint=http://127.0.0.1:{azurite_table}/{ACCOUNT}"
    runs, go = sq.tmp / "runs", sq.tmp / "go"
    ids = sq.ctl("push", "--file", "-", input="".join(
        f"echo $JOBQ_TASK_ID >> {runs}; while [ ! -e {go} ]; do sleep 0.1; done\n"
        for _ in range(TASKS))).stdout.split()
    with FaultProxy(("127.0.0.1", sq.port)) as proxy:
        # the queue through the proxy, the control store (result records) direct
        via = sq.secret_env(proxy.port)["JOBQ_CONNECTION_STRING"]
        env = {"JOBQ_CONNECTION_STRING": via + table}
        sup = sq.supervisor("-n", str(TASKS), *LEASE, "--heartbeat-interval", "1",
                            "--control-interval", "1", env=env, name="w-settle")
        wait_for(lambda: runs.exists() and len(runs.read_text().split()) == TASKS, 30,
                 what=f"all tasks started\n{sup.log()[-3000:]}")
        proxy.blackhole()
        t_hole = time.monotonic()
        go.touch()  # every slot is busy until now: the worker receives nothing meanwhile
        # the first back-off steps went by: three failed tries of each task
        wait_for(lambda: sup.log().count("settlement failed") >= 3 * TASKS, OUTAGE - 2,
                 what=f"failed settlements\n{sup.log()[-3000:]}")
        wait_for(lambda: time.monotonic() - t_hole >= OUTAGE, OUTAGE + 5, what="the outage")
        proxy.reset_all()  # what was sent into the hole is lost, not delivered late
        proxy.restore()
        wait_for(lambda: sq.count() == 0, 90,
                 what=f"every message deleted\n{sup.log()[-4000:]}")
        sup.signal(signal.SIGTERM)
        assert sup.wait(30) == 0, sup.log()[-3000:]
    log = sup.log()
    assert sorted(runs.read_text().split()) == sorted(ids), f"a task ran twice:\n{log[-4000:]}"
    for bad in ("refused", "lock lost", "lease lost", "could not settle", "Traceback"):
        assert bad not in log, f"{bad!r} in the log:\n{log[-4000:]}"
    direct = {"JOBQ_CONNECTION_STRING": sq.conn_str + table}
    for task_id in ids:
        attempts = json.loads(sq.ctl("result", task_id, "--json", env=direct).stdout)
        assert [(a["attempt"], a["state"], a["exit_status"], a["final"]) for a in attempts] \
            == [(1, "succeeded", 0, True)], attempts
