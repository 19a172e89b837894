"""Which output store the settings name (fleet/output/open.py, by fleet/storage_account.py):
the control store's account, never a guessed endpoint.  No network: stores are only constructed."""

from __future__ import annotations

import logging

import pytest

from supervisor.core.settings import Settings
from supervisor.fleet.output.azure_blob import BlobOutputStore
from supervisor.fleet.output.base import OutputConfigError
from supervisor.fleet.output.files import FileOutputStore
from supervisor.fleet.output.open import open_output_store
from supervisor.fleet.storage_account import service_connection_string, service_url

KEY = "a2V5"  # base64 of "key"
EMULATOR = "http://127.0.0.1:10001/devstoreaccount1"


@pytest.fixture(autouse=True)
def no_env_connection_string(monkeypatch) -> None:
    monkeypatch.delenv("JOBQ_CONTROL_CONNECTION_STRING", raising=False)


def blob(settings: Settings) -> BlobOutputStore:
    store = open_output_store(settings, create=False)
    assert isinstance(store, BlobOutputStore), store
    return store


def test_sqlite_keeps_files_beside_the_database(tmp_path) -> None:
    store = open_output_store(Settings(sqlite_path=str(tmp_path / "q.db")))
    assert isinstance(store, FileOutputStore) and store.root == str(tmp_path / "q.db.output")


def test_no_control_store_no_output_store(tmp_path) -> None:
    assert open_output_store(Settings(sqlite_path=str(tmp_path / "q.db"), control="off")) is None
    assert open_output_store(Settings(backend="servicebus", namespace="ns")) is None


def test_queue_account_url_becomes_the_blob_host() -> None:
    s = Settings(backend="storage-queue", account_url="https://acct.queue.core.windows.net/",
                 task_log_container="my-logs")
    assert blob(s).endpoint == "https://acct.blob.core.windows.net/my-logs"


def test_a_sas_stays_with_the_url_and_out_of_the_name() -> None:
    s = Settings(backend="storage-queue",
                 account_url="https://acct.queue.core.windows.net?sv=1&sig=c2VjcmV0c2lnbmF0dXJl")
    store = blob(s)
    assert store.endpoint == "https://acct.blob.core.windows.net/jobq-logs"
    assert "c2VjcmV0" not in repr(store)
    assert service_url("https://acct.table.core.windows.net?sv=1&sig=x", "blob") == \
        "https://acct.blob.core.windows.net?sv=1&sig=x"


def test_explicit_control_account_url_wins_over_the_queue_account() -> None:
    s = Settings(backend="storage-queue", account_url="https://q.queue.core.windows.net",
                 control_account_url="https://ctl.table.core.windows.net")
    assert blob(s).endpoint == "https://ctl.blob.core.windows.net/jobq-logs"
    s = Settings(backend="servicebus", namespace="ns",
                 control_account_url="https://ctl.table.core.windows.net")
    assert blob(s).endpoint == "https://ctl.blob.core.windows.net/jobq-logs"


def test_a_host_that_is_not_azure_storage_gives_no_store(caplog) -> None:
    with caplog.at_level(logging.INFO, logger="jobq.output"):
        assert open_output_store(Settings(backend="storage-queue", account_url=EMULATOR)) is None
        assert open_output_store(Settings(backend="servicebus", namespace="ns",
                                          control_account_url=EMULATOR)) is None
    assert "cannot tell the blob endpoint" in caplog.text
    assert service_url("https://acct.queue.core.windows.net.evil.example", "blob") is None


def test_a_url_that_is_not_http_can_never_work() -> None:
    with pytest.raises(OutputConfigError):
        open_output_store(Settings(backend="servicebus", namespace="ns",
                                   control_account_url="ftp://acct.table.core.windows.net"))


def test_connection_string_with_a_blob_endpoint_is_used(monkeypatch) -> None:
    conn = (f"DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey={KEY};"
            f"QueueEndpoint={EMULATOR};BlobEndpoint=http://127.0.0.1:10000/devstoreaccount1")
    s = Settings(backend="storage-queue", connection_string=conn)
    assert blob(s).endpoint == "http://127.0.0.1:10000/devstoreaccount1/jobq-logs"
    monkeypatch.setenv("JOBQ_CONTROL_CONNECTION_STRING", conn)
    assert blob(Settings(backend="servicebus", namespace="ns")).endpoint.startswith(
        "http://127.0.0.1:10000/")


def test_a_real_account_connection_string_names_its_blob_host() -> None:
    conn = f"DefaultEndpointsProtocol=https;AccountName=acct;AccountKey={KEY};" \
           "EndpointSuffix=core.windows.net"
    assert blob(Settings(backend="storage-queue", connection_string=conn)).endpoint == \
        "https://acct.blob.core.windows.net/jobq-logs"
    conn += ";QueueEndpoint=https://acct.queue.core.windows.net/"
    assert service_connection_string(conn, "blob") == conn


@pytest.mark.parametrize("conn", [
    "UseDevelopmentStorage=true",
    f"DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey={KEY};"
    f"QueueEndpoint={EMULATOR}",
    f"DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey={KEY};"
    "TableEndpoint=http://127.0.0.1:10002/devstoreaccount1",
    "QueueEndpoint=https://acct.queue.core.windows.net/;SharedAccessSignature=sv=1&sig=x",
])
def test_an_emulator_blob_endpoint_is_never_guessed(conn, caplog) -> None:
    with caplog.at_level(logging.INFO, logger="jobq.output"):
        assert open_output_store(Settings(backend="storage-queue", connection_string=conn)) \
            is None
        assert open_output_store(Settings(backend="servicebus", namespace="ns",
                                          control_connection_string=conn)) is None
    assert "names no blob endpoint" in caplog.text


def test_postgres_keeps_output_in_its_schema_and_connects_only_when_used() -> None:
    """Made without a call (the worker's main thread only names it; the URL reaches no
    server); the password never in its name; ``--control off``: none."""
    from supervisor.fleet.output.open import describe_output_store
    from supervisor.fleet.output.postgres import PostgresOutputStore

    url = "postgresql://jobq:s3cret-Pw@127.0.0.1:9/jobs"
    s = Settings(backend="postgres", postgres_url=url, postgres_schema="team_a",
                 postgres_notify="off")
    store = open_output_store(s, create=False, read_timeout=5.0)
    assert isinstance(store, PostgresOutputStore)
    assert (store.schema, store.create, store.timeout, store.notify, store.prepare) == \
        ("team_a", False, 5.0, False, False)
    assert describe_output_store(s) == \
        "PostgresOutputStore('schema team_a on 127.0.0.1:9/jobs')"
    assert "s3cret" not in repr(store)
    assert open_output_store(Settings(backend="postgres", postgres_url=url,
                                      control="off")) is None
