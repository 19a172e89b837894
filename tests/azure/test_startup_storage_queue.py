"""Start-up on Storage Queue (Azurite): a worker makes its queue before the first receive but
not ``<queue>-failed`` -- one round trip less -- and still makes that one at the first record;
jobq-ctl keeps making both (ai4s-jobq workers on the same queue dead-letter into it)."""

from __future__ import annotations

import pytest
from azure.storage.queue import QueueClient, QueueServiceClient

from supervisor.core.task import Task
from tests.azure_envs import SqEnv
from tests.azurite import queue_connection_string

pytestmark = [pytest.mark.azure, pytest.mark.timeout(120)]


def _queues(port: int) -> set[str]:
    with QueueServiceClient.from_connection_string(queue_connection_string(port)) as svc:
        return {q.name for q in svc.list_queues()}


def test_worker_makes_its_failed_queue_at_the_first_record_only(tmp_path, azurite, queue_name):
    sq = SqEnv(tmp_path, azurite.port, queue_name)
    try:
        sup = sq.supervisor("--exit-when-empty", "--control", "off")
        assert sup.wait(60) == 0, sup.log()
        assert queue_name in _queues(azurite.port)  # a new queue is still made at start
        assert queue_name + "-failed" not in _queues(azurite.port)
        # Pushed with the SDK, not jobq-ctl (which makes both queues).
        with QueueClient.from_connection_string(queue_connection_string(azurite.port),
                                                queue_name) as client:
            client.send_message(Task(cmd="exit 3", id="fails-once", max_attempts=1).to_json())
        sup = sq.supervisor("--exit-when-empty", "--control", "off")
        assert sup.wait(60) == 4, sup.log()
        assert "deleted?" not in sup.log()  # not made at start is no loss: no warning
        assert [r["id"] for r in sq.failed_records()] == ["fails-once"]
    finally:
        sq.cleanup()


def test_ctl_push_still_makes_both_queues(tmp_path, azurite, queue_name):
    sq = SqEnv(tmp_path, azurite.port, queue_name)
    sq.ctl("push", "-c", "true")
    assert {queue_name, queue_name + "-failed"} <= _queues(azurite.port)
