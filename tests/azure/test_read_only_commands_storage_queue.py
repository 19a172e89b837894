"""Issue 14 on Storage Queue (Azurite): read-only commands create nothing (bug 4), the JSON
contract of status/failed (item 8)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess

import pytest
from azure.storage.queue import QueueClient, QueueServiceClient

from supervisor.backends.storage_queue.errors import make_record
from tests import ctl_server
from tests.azurite import queue_connection_string
from tests.conftest import command, wait_for

pytestmark = [pytest.mark.azure, pytest.mark.timeout(120)]


def _ctl(tmp_path, port: int, queue: str, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, JOBQ_CONNECTION_STRING=queue_connection_string(port))
    return ctl_server.run(command("jobq-ctl") + ["--backend", "storage-queue", "--queue", queue,
                                                 *args], timeout=60, env=env, cwd=tmp_path)


def _queues(port: int) -> set[str]:
    with QueueServiceClient.from_connection_string(queue_connection_string(port)) as svc:
        return {q.name for q in svc.list_queues()}


@pytest.mark.parametrize("args", [["size"], ["peek"], ["status", "--json"], ["failed"]],
                         ids=" ".join)
def test_read_only_command_on_missing_queue_is_exit_1_and_creates_nothing(
        tmp_path, azurite, queue_name, args):
    res = _ctl(tmp_path, azurite.port, queue_name, *args)
    assert res.returncode == 1, res
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and queue_name in lines[0] and "does not exist" in lines[0], res
    assert res.stdout == ""
    assert not {queue_name, queue_name + "-failed"} & _queues(azurite.port)


def test_missing_failed_companion_reads_as_empty(tmp_path, azurite, queue_name):
    with QueueServiceClient.from_connection_string(queue_connection_string(azurite.port)) as svc:
        svc.create_queue(queue_name)  # made by another tool: no -failed twin
    assert _ctl(tmp_path, azurite.port, queue_name, "size").stdout.strip() == "0"
    res = _ctl(tmp_path, azurite.port, queue_name, "failed", "--json")
    assert res.returncode == 0 and res.stdout.strip() == "[]", res
    assert _ctl(tmp_path, azurite.port, queue_name, "status").returncode == 0
    assert queue_name + "-failed" not in _queues(azurite.port)
    # a writing command still makes what it needs
    assert _ctl(tmp_path, azurite.port, queue_name, "push", "-c", "true").returncode == 0


ISO = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")


def test_status_json_does_not_call_held_messages_pending(tmp_path, azurite, queue_name):
    port = azurite.port
    assert _ctl(tmp_path, port, queue_name, "push", "-c", "true", "-c", "true").returncode == 0
    client = QueueClient.from_connection_string(queue_connection_string(port), queue_name)
    with client:  # a worker holds one message invisible (running)
        [held] = list(next(client.receive_messages(messages_per_page=1,
                                                   visibility_timeout=60).by_page()))[:1]
    status = json.loads(_ctl(tmp_path, port, queue_name, "status", "--json").stdout)
    assert "pending" not in status["counts"], status
    assert status["counts"]["queued"] == 2 and "cannot tell" in status["note"], status
    text = _ctl(tmp_path, port, queue_name, "status").stdout
    assert "queued=2" in text and "note: " in text


def test_failed_json_time_is_iso_utc(tmp_path, azurite, queue_name):
    port = azurite.port
    assert _ctl(tmp_path, port, queue_name, "clear").returncode == 0  # creates both queues
    record = make_record('{"cmd": "exit 3"}', None, "exit status 3", 1, 3, "", "w", "m-1")
    failed = QueueClient.from_connection_string(queue_connection_string(port),
                                                queue_name + "-failed")
    with failed:
        failed.send_message(record, time_to_live=-1)
    [row] = json.loads(_ctl(tmp_path, port, queue_name, "failed", "--json").stdout)
    assert ISO.match(row["failed_at"]), row
    assert f"failed {row['failed_at']}" in _ctl(tmp_path, port, queue_name, "failed").stdout


@pytest.fixture
def sq(tmp_path, azurite, queue_name):
    from tests.azure_envs import SqEnv

    e = SqEnv(tmp_path, azurite.port, queue_name)
    e.ctl("clear")  # creates both queues
    yield e
    e.cleanup()


def test_worker_recreates_its_queues_when_they_vanish(sq, azurite):
    """Bug 5: Azurite restarted in memory loses every queue; the worker made them at start
    and makes them again, instead of 'queue does not exist' every 10 s for ever."""
    sup = sq.supervisor("--poll-interval", "0.5")
    sup.wait_log(" started: backend=")
    with QueueServiceClient.from_connection_string(queue_connection_string(azurite.port)) as svc:
        svc.delete_queue(sq.queue)
        svc.delete_queue(sq.queue + "-failed")
    wait_for(lambda: sq.queue in _queues(azurite.port), 30, what="main queue made again")
    # logged before the create; the log thread may write it a moment after the queue exists
    sup.wait_log(f"queue {sq.queue} does not exist (deleted?); creating it again", 10)
    # the dead-letter record makes its queue again too
    [task] = sq.ctl("push", "-c", "exit 3", "--max-attempts", "1").stdout.split()
    wait_for(lambda: sq.queue + "-failed" in _queues(azurite.port), 30,
             what="failed queue made again")
    wait_for(lambda: [r["id"] for r in sq.failed_records()] == [task], 30,
             what="record in the remade failed queue")
    sup.signal(signal.SIGTERM)
    assert sup.wait(30) == 0
