"""Result records on the Storage Queue backend (Azurite's queue service) with Azure Table
Storage as the control store (Azurite's table service): a worker writes each attempt's
record -- batched, one batch transaction per partition -- and ``jobq-ctl result --json``
reads them from any machine that can reach the table."""

from __future__ import annotations

import json
import signal

import pytest

from supervisor.fleet.control.azure_table import AzureTableControlStore
from tests.azurite import table_connection_string
from tests.conftest import wait_for

pytestmark = [pytest.mark.azure, pytest.mark.timeout(120)]


def test_a_storage_queue_worker_writes_each_attempts_result(sq, azurite_table):
    control = {"JOBQ_CONTROL_CONNECTION_STRING": table_connection_string(azurite_table)}
    store = AzureTableControlStore(connection_string=table_connection_string(azurite_table))
    try:
        ok, flaky, killed = sq.ctl(
            "push", "--max-attempts", "2", "-c", "echo fine",
            "-c", 'if [ "$JOBQ_ATTEMPT" = 1 ]; then echo first; exit 3; fi; echo second',
            "-c", "kill -9 $$").stdout.split()
        sup = sq.supervisor("--worker-id", "w-sq-r", "--retry-delay", "0",
                            "--poll-interval", "0.2", "--control-interval", "1", env=control)

        def states(task_id: str) -> list[tuple[int, str, bool]]:
            return [(r.attempt, r.outcome, r.final) for r in store.results_of(sq.queue,
                                                                              task_id)]

        wait_for(lambda: states(flaky) == [(1, "failed", False), (2, "succeeded", True)]
                 and states(killed) == [(1, "failed", False), (2, "failed", True)]
                 and states(ok) == [(1, "succeeded", True)], 60,
                 what="every attempt's end record")
        sup.signal(signal.SIGTERM)
        assert sup.wait(30) == 0
        out = json.loads(sq.ctl("result", killed, "--json", env=control).stdout)
        assert [(r["attempt"], r["state"], r["exit_status"], r["signal"], r["worker"])
                for r in out] == [(1, "failed", None, 9, "w-sq-r"), (2, "failed", None, 9,
                                                                  "w-sq-r")]
        assert all(r["started"] and r["finished"] for r in out)
        (first, _) = store.results_of(sq.queue, flaky)
        assert first.exit_status == 3 and "first" in first.tail
        assert [r.task_id for r in store.results(sq.queue, "failed")].count(killed) == 2
    finally:
        store.close()
