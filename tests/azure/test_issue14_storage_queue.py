"""Issue 14 on Storage Queue (Azurite): read-only commands create nothing (bug 4), the JSON
contract of status/failed (item 8)."""

from __future__ import annotations

import os
import subprocess

import pytest
from azure.storage.queue import QueueServiceClient

from tests.azure.test_storage_queue_backend import connection_string
from tests.conftest import command

pytestmark = [pytest.mark.azure, pytest.mark.timeout(120)]


def _ctl(tmp_path, port: int, queue: str, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, JOBQ_CONNECTION_STRING=connection_string(port))
    return subprocess.run(command("jobq-ctl") + ["--backend", "storage-queue", "--queue", queue,
                                                 *args],
                          capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path)


def _queues(port: int) -> set[str]:
    with QueueServiceClient.from_connection_string(connection_string(port)) as svc:
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
    with QueueServiceClient.from_connection_string(connection_string(azurite.port)) as svc:
        svc.create_queue(queue_name)  # made by another tool: no -failed twin
    assert _ctl(tmp_path, azurite.port, queue_name, "size").stdout.strip() == "0"
    res = _ctl(tmp_path, azurite.port, queue_name, "failed", "--json")
    assert res.returncode == 0 and res.stdout.strip() == "[]", res
    assert _ctl(tmp_path, azurite.port, queue_name, "status").returncode == 0
    assert queue_name + "-failed" not in _queues(azurite.port)
    # a writing command still makes what it needs
    assert _ctl(tmp_path, azurite.port, queue_name, "push", "-c", "true").returncode == 0
