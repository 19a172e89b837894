"""Issue 26, section 2: the control table deleted under running workers (an in-memory
Azurite restarted, an operator's delete) comes back by itself, every time, whatever form the
SDK reports a missing table in -- a query's or an upsert's ResourceNotFoundError
(TableNotFound), an insert's, or a batch's TableTransactionError ("0:The table specified does
not exist").  Azurite's table service of its own per test, since the tests delete its table."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator

import pytest
from azure.data.tables import TableServiceClient

from supervisor.fleet.control import ResultRecord, WorkerRecord
from supervisor.fleet.control.azure_table import DEFAULT_TABLE, AzureTableControlStore
from supervisor.fleet.control.base import UniqueClaim
from tests.azurite import azurite_service, service_binary, table_connection_string
from tests.conftest import Env, wait_for

pytestmark = [pytest.mark.azure, pytest.mark.timeout(120)]
Q = "default"
BACK_WITHIN = 20.0  # s: heartbeats every 1 s, a missing table found by the next call


@pytest.fixture
def conn(tmp_path) -> Iterator[str]:
    binary = service_binary("table")
    if binary is None:
        pytest.skip("azurite-table not found (see tests/azurite.py)")
    cwd = tmp_path / "azurite-table"
    cwd.mkdir()
    with azurite_service(binary, "table", cwd) as (port, _pid):
        yield table_connection_string(port)


def delete_table(conn: str) -> None:
    with TableServiceClient.from_connection_string(conn) as service:
        # (not checked gone with a listing: running workers may have made it again already)
        service.delete_table(DEFAULT_TABLE)


def result(task_id: str, when: float) -> ResultRecord:
    return ResultRecord(queue=Q, task_id=task_id, attempt=1, outcome="succeeded", reason="",
                        tail="", exit_status=0, worker="w", when=when, final=True)


def worker(when: float) -> WorkerRecord:
    return WorkerRecord(id="w", queue=Q, host="h", pid=1, version="0", state="running",
                        slots_used=0, slots_total=1, started=when, heartbeat=when,
                        interval=15.0, tasks=())


@pytest.mark.parametrize("first_call", ["put_results", "put_worker", "poll", "create_claim"])
def test_every_call_form_makes_the_table_again_every_time(conn, first_call) -> None:
    store = AzureTableControlStore(connection_string=conn)
    try:
        for n in range(3):  # made by the first call, then lost twice
            now = time.time()
            if n:
                delete_table(conn)
            if first_call == "put_results":  # a batch transaction
                store.put_results([result(f"t{n}", now)])
            elif first_call == "put_worker":  # an upsert
                store.put_worker(worker(now))
            elif first_call == "poll":  # a query
                assert store.poll(Q, "w").cancels == ()
            else:  # an insert
                assert store.create_claim(UniqueClaim(Q, f"k{n}", f"t{n}", now))
            store.put_results([result(f"u{n}", now)])  # and the table is usable again
            assert [r.task_id for r in store.results(Q)][-1] == f"u{n}"
    finally:
        store.close()


def test_two_workers_bring_the_deleted_table_back_and_a_cancel_works(env: Env, conn) -> None:
    ctl_env = {"JOBQ_CONTROL_CONNECTION_STRING": conn}
    ids = env.push("sleep 300", "sleep 300", "sleep 300", "sleep 300")
    sups = [env.supervisor("--worker-id", f"w{i}", "-n", "2", "--control-interval", "1",
                           "--heartbeat-interval", "1", env=ctl_env) for i in (1, 2)]

    last = [""]

    def both_listed() -> bool:
        last[0] = out = env.ctl("workers", env=ctl_env, check=False).stdout
        return "w1" in out and "w2" in out

    def listed_within(seconds: float, what: str) -> None:
        try:
            wait_for(both_listed, seconds, what=what)
        except AssertionError as exc:
            logs = "\n".join(s.log() for s in sups)
            raise AssertionError(f"{exc}\nlast listing:\n{last[0]}\nlogs:\n{logs}") from None

    listed_within(60, "both workers in `jobq-ctl workers`")  # start-up on a busy machine
    wait_for(lambda: all(env.job(t)["status"] == "running" for t in ids), 30,
             what="all four tasks running")
    for n, task_id in enumerate(ids[:2]):
        delete_table(conn)
        t_deleted = time.monotonic()
        listed_within(BACK_WITHIN, f"both workers listed after deletion {n + 1}")
        assert time.monotonic() - t_deleted < BACK_WITHIN
        env.ctl("cancel", task_id, "--reason", f"after deletion {n + 1}", env=ctl_env)
        wait_for(lambda t=task_id: env.job(t)["status"] == "failed", 30,
                 what=f"the cancel after deletion {n + 1} carried out")
        assert env.job(task_id)["reason"].startswith("cancelled by ")
    for sup in sups:
        sup.signal(signal.SIGTERM)
    for sup in sups:
        sup.wait(60)
        assert "table specified does not exist" not in sup.log()
