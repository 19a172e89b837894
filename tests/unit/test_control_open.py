"""Which control store the settings name (fleet/control/open.py): never a guessed endpoint,
and by the rule the output store follows too (fleet/storage_account.py)."""

from __future__ import annotations

import logging

import pytest

from supervisor.core.settings import Settings
from supervisor.fleet.control.azure_table import AzureTableControlStore
from supervisor.fleet.control.open import control_store_description, open_control_store
from supervisor.fleet.control.sqlite import SqliteControlStore
from supervisor.fleet.output.azure_blob import BlobOutputStore
from supervisor.fleet.output.open import open_output_store

KEY = "a2V5"  # base64 of "key"
CLOSED = "http://127.0.0.1:9"  # discard port: nothing listens, nothing is sent (create=False)


def sq(conn: str, **kw) -> Settings:
    return Settings(backend="storage-queue", connection_string=conn, **kw)


def test_sqlite_uses_the_queue_file(tmp_path) -> None:
    s = Settings(sqlite_path=str(tmp_path / "q.db"))
    store = open_control_store(s)
    assert isinstance(store, SqliteControlStore) and store.path == s.sqlite_path
    assert control_store_description(s) == f"sqlite {s.sqlite_path}"


def test_off_means_none(tmp_path) -> None:
    s = Settings(sqlite_path=str(tmp_path / "q.db"), control="off")
    assert open_control_store(s) is None and control_store_description(s) == "off"


def test_servicebus_without_a_storage_account_has_none(monkeypatch) -> None:
    monkeypatch.delenv("JOBQ_CONTROL_CONNECTION_STRING", raising=False)
    s = Settings(backend="servicebus", namespace="ns.servicebus.windows.net")
    assert open_control_store(s) is None and control_store_description(s) == "none"


def test_emulator_queue_endpoint_is_not_guessed_into_a_table_endpoint(caplog) -> None:
    conn = (f"DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey={KEY};"
            "QueueEndpoint=http://127.0.0.1:10001/devstoreaccount1")
    with caplog.at_level(logging.INFO, logger="jobq.control"):
        assert open_control_store(sq(conn)) is None
    assert "names no table endpoint" in caplog.text


def test_non_azure_account_url_is_not_guessed(caplog) -> None:
    s = Settings(backend="storage-queue", account_url="http://127.0.0.1:10001/acct")
    with caplog.at_level(logging.INFO, logger="jobq.control"):
        assert open_control_store(s) is None
    assert "cannot tell the table endpoint" in caplog.text


def test_a_table_endpoint_in_the_connection_string_is_used() -> None:
    conn = (f"DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey={KEY};"
            f"QueueEndpoint=http://127.0.0.1:10001/devstoreaccount1;"
            f"TableEndpoint={CLOSED}/devstoreaccount1")
    store = open_control_store(sq(conn), create=False)
    assert isinstance(store, AzureTableControlStore)
    assert store.endpoint.startswith(CLOSED)


@pytest.mark.parametrize("option", ["control_connection_string", "env"])
def test_an_explicit_control_store_wins(monkeypatch, option) -> None:
    conn = (f"DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey={KEY};"
            f"TableEndpoint={CLOSED}/devstoreaccount1")
    monkeypatch.delenv("JOBQ_CONTROL_CONNECTION_STRING", raising=False)
    kw = {}
    if option == "env":
        monkeypatch.setenv("JOBQ_CONTROL_CONNECTION_STRING", conn)
    else:
        kw[option] = conn
    s = Settings(backend="servicebus", namespace="ns.servicebus.windows.net", **kw)
    store = open_control_store(s, create=False)
    assert isinstance(store, AzureTableControlStore) and store.endpoint.startswith(CLOSED)


def test_the_control_connection_string_is_redacted_and_validated() -> None:
    s = Settings(control_connection_string="AccountKey=secret")
    assert "secret" not in repr(s)
    with pytest.raises(ValueError, match="control-account-url"):
        Settings(control_connection_string="x", control_account_url="https://a").validate()
    with pytest.raises(ValueError, match="control-interval"):
        Settings(control_interval=0).validate()


@pytest.mark.parametrize("account", [
    {"account_url": "https://acct.queue.core.windows.net?sv=1&sig=x"},
    {"account_url": "https://ACCT.QUEUE.CORE.WINDOWS.NET?sv=1&sig=x"},  # DNS has no case
    {"account_url": "https://acct.sub.queue.core.windows.net?sv=1&sig=x"},
    {"account_url": "http://127.0.0.1:10001/acct?sv=1&sig=x"},
    {"connection_string": f"DefaultEndpointsProtocol=https;AccountName=acct;AccountKey={KEY}"},
    {"connection_string": f"DefaultEndpointsProtocol=https;AccountName=acct;AccountKey={KEY};"
                          "QueueEndpoint=https://acct.queue.core.windows.net;"
                          "FileEndpoint=http://127.0.0.1:10004/acct"},
])
def test_control_and_output_stores_agree_on_the_account(monkeypatch, account) -> None:
    """One rule (fleet/storage_account.py) says where a Storage Queue's account has its
    table and its blobs: both stores exist, each at the account's own host, or neither."""
    monkeypatch.delenv("JOBQ_CONTROL_CONNECTION_STRING", raising=False)
    s = Settings(backend="storage-queue", **account)
    control = open_control_store(s, create=False)
    output = open_output_store(s, create=False)
    assert (control is None) == (output is None), (control, output)
    if isinstance(control, AzureTableControlStore) and isinstance(output, BlobOutputStore):
        assert control.endpoint == "https://acct.table.core.windows.net"
        assert output.endpoint.startswith("https://acct.blob.core.windows.net/")
