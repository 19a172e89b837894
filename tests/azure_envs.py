"""What tests on Azurite share: ``SqEnv`` (one test's Storage Queue, both commands configured
for it) and ``Stores`` (one test's control table and output container).  The fixtures that
make them (``sq``, ``table``, ``stores``) are in tests/conftest.py."""

from __future__ import annotations

import json
from dataclasses import dataclass

from azure.storage.queue import QueueClient

from supervisor.fleet.output.azure_blob import BlobOutputStore
from tests.azurite import ACCOUNT, ACCOUNT_KEY, blob_connection_string, queue_connection_string
from tests.conftest import Env


class SqEnv(Env):
    """Like the SQLite Env, but every command talks to one Azurite queue."""

    def __init__(self, tmp, port: int, queue: str) -> None:
        super().__init__(tmp)
        self.port = port
        self.queue = queue
        self.conn_str = queue_connection_string(port)

    def base_args(self) -> list[str]:
        return ["--backend", "storage-queue", "--queue", self.queue]

    def secret_env(self, port: int | None = None) -> dict[str, str]:
        return {"JOBQ_CONNECTION_STRING": queue_connection_string(port or self.port)}

    def supervisor(self, *args, env=None, via_port: int | None = None, **kw):
        full = self.secret_env(via_port)
        full.update(env or {})
        return super().supervisor(*args, env=full, **kw)

    def client(self, suffix: str = "") -> QueueClient:
        return QueueClient.from_connection_string(self.conn_str, self.queue + suffix)

    def count(self, suffix: str = "") -> int:
        """Messages in the queue, visible or not."""
        return self.client(suffix).get_queue_properties().approximate_message_count

    def failed_records(self) -> list[dict]:
        return json.loads(self.ctl("failed", "--json").stdout)


@dataclass
class Stores:
    """The table and blob services of one test, with a container of its own (a worker's
    purge lists the whole container)."""

    table_port: int
    blob_port: int
    container: str

    def env(self, blob_port: int | None = None) -> dict[str, str]:
        """The control connection string (blob through ``blob_port`` when given)."""
        conn = (f"DefaultEndpointsProtocol=http;AccountName={ACCOUNT};AccountKey={ACCOUNT_KEY};"
                f"TableEndpoint=http://127.0.0.1:{self.table_port}/{ACCOUNT};"
                f"BlobEndpoint=http://127.0.0.1:{blob_port or self.blob_port}/{ACCOUNT}")
        return {"JOBQ_CONTROL_CONNECTION_STRING": conn,
                "JOBQ_TASK_LOG_CONTAINER": self.container}

    def reader(self) -> BlobOutputStore:
        return BlobOutputStore(connection_string=blob_connection_string(self.blob_port),
                               container=self.container, create=False)
