"""``describe_output_store``: the worker's start-up line names the store ``open_output_store``
opens, without importing a storage SDK on the main thread (outstore/open.py)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from supervisor.core.settings import Settings
from supervisor.fleet.output.open import describe_output_store, open_output_store

pytestmark = pytest.mark.timeout(60)

KEY = "a2V5LWZvci10aGUtdGVzdHMtb25seS1ub3QtYS1yZWFsLW9uZQ=="
CONNS = [
    f"DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey={KEY};"
    "QueueEndpoint=http://127.0.0.1:1/devstoreaccount1;"
    "BlobEndpoint=http://127.0.0.1:3/devstoreaccount1",
    f"DefaultEndpointsProtocol=https;AccountName=acct;AccountKey={KEY};"
    "EndpointSuffix=core.windows.net",
    f"DefaultEndpointsProtocol=https;AccountName=acct;AccountKey={KEY}",
    f"DefaultEndpointsProtocol=http;AccountName=acct;AccountKey={KEY};"
    "EndpointSuffix=core.chinacloudapi.cn",
]


@pytest.mark.parametrize("settings", [
    *(Settings(backend="storage-queue", connection_string=c) for c in CONNS),
    Settings(backend="storage-queue", connection_string=CONNS[1], task_log_container="other"),
    Settings(backend="storage-queue", account_url="https://acct.queue.core.windows.net"),
    Settings(backend="storage-queue", account_url="https://acct.queue.core.windows.net/?sv=1&sig=s"),
    Settings(backend="servicebus", connection_string="Endpoint=sb://x/;SharedAccessKeyName=k;"
             "SharedAccessKey=v", control_connection_string=CONNS[1]),
    Settings(backend="storage-queue", connection_string=CONNS[0], control="off"),
])
def test_the_description_is_what_opens(settings) -> None:
    store = open_output_store(settings, create=False)
    try:
        assert describe_output_store(settings) == (repr(store) if store else None)
    finally:
        if store is not None:
            store.close()


def test_files_are_described_too(tmp_path) -> None:
    settings = Settings(sqlite_path=str(tmp_path / "jobq.db"))
    store = open_output_store(settings, create=False)
    assert store is not None
    assert describe_output_store(settings) == repr(store)


def test_a_worker_imports_neither_the_blob_sdk_nor_the_control_store_to_describe_it() -> None:
    code = (
        "import sys\n"
        "from supervisor.fleet.shipper import OutputShipper\n"
        "from supervisor.core.settings import Settings\n"
        f"shipper = OutputShipper.for_worker(Settings(backend='storage-queue', "
        f"connection_string={CONNS[1]!r}))\n"
        "assert shipper is not None and 'acct.blob' in shipper.where, shipper\n"
        "print(sorted(m for m in sys.modules if m.startswith(('azure.storage.blob', "
        "'supervisor.fleet.control'))))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "[]"
