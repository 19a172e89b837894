"""Which output store a worker or ``jobq-ctl`` uses, from its Settings (main thread).

The output store lives beside the control store (control/open.py): a SQLite queue's in files
beside its database (files.py); an Azure control store's in blob container
``--task-log-container`` of the same storage account (azure_blob.py).  No control store, no
output store.

The blob endpoint is derived the way control/open.py derives the table endpoint, and never
guessed: an account URL's ``ACCOUNT.table``/``ACCOUNT.queue`` host becomes
``ACCOUNT.blob.core.windows.net`` (another host, such as an emulator's, gives no store); a
connection string is used when it names a ``BlobEndpoint=`` or a real account (an account
name, no development storage, and no explicit endpoint outside ``*.core.windows.net``).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Union
from urllib.parse import urlsplit, urlunsplit

from ..control.open import named_account
from .base import OutputConfigError, OutputStore

if TYPE_CHECKING:
    from ..settings import Settings

log = logging.getLogger("jobq.output")


def blob_endpoint(account_url: str) -> Union[str, None]:
    """https://ACCOUNT.(queue|table|blob).core.windows.net[/...][?sas] ->
    https://ACCOUNT.blob.core.windows.net[?sas]; None for any other host."""
    parts = urlsplit(account_url)
    labels = (parts.hostname or "").split(".")
    if len(labels) != 5 or labels[1] not in ("queue", "table", "blob") \
            or labels[2:] != ["core", "windows", "net"]:
        return None
    labels[1] = "blob"
    netloc = ".".join(labels) + (f":{parts.port}" if parts.port else "")
    return urlunsplit((parts.scheme, netloc, "", parts.query, ""))


def blob_connection_string(conn: str) -> Union[str, None]:
    """The connection string itself when the Blob SDK can find the blob service from it
    without a guess, else None."""
    fields: dict[str, str] = {}
    for item in conn.split(";"):
        key, sep, value = item.partition("=")
        if sep:
            fields[key.strip().lower()] = value.strip()
    if "blobendpoint" in fields:
        return conn
    if "accountname" not in fields or "usedevelopmentstorage" in fields:
        return None
    for endpoint in ("queueendpoint", "tableendpoint", "fileendpoint"):
        host = urlsplit(fields.get(endpoint, "")).hostname
        if host is not None and not host.endswith(".core.windows.net"):
            return None  # an emulator or proxy: where its blobs are nobody said
    return conn


def open_output_store(settings: Settings, create: bool = True,
                      read_timeout: float = 10.0) -> Union[OutputStore, None]:
    """The output store these settings name, or None (main thread; raises OutputConfigError
    for a configuration that can never work).  ``create=False``: nothing is created.
    ``read_timeout``: per blob call (jobq-ctl passes less, to fail within 10 s in all)."""
    if settings.control == "off":
        return None
    url, conn = named_account(settings)
    if settings.backend == "sqlite" and not (url or conn):
        from .files import FileOutputStore, output_dir

        return FileOutputStore(output_dir(settings.sqlite_path))
    if not (url or conn) and settings.backend == "storage-queue":
        url, conn = settings.account_url, settings.connection_string
    if url:
        if not urlsplit(url).scheme.startswith("http"):
            raise OutputConfigError(f"output store: not an http(s) URL: {url!r}")
        blob_url = blob_endpoint(url)
        if blob_url is None:
            log.info("output store: off -- cannot tell the blob endpoint of %s",
                     url.split("?", 1)[0])
            return None
        return _blob_store(settings, create, read_timeout, account_url=blob_url)
    if conn:
        blob_conn = blob_connection_string(conn)
        if blob_conn is None:
            log.info("output store: off -- the connection string names no blob endpoint "
                     "(add BlobEndpoint=)")
            return None
        return _blob_store(settings, create, read_timeout, connection_string=blob_conn)
    return None


def _blob_store(settings: Settings, create: bool, read_timeout: float,
                account_url: Union[str, None] = None,
                connection_string: Union[str, None] = None) -> OutputStore:
    from .azure_blob import BlobOutputStore

    return BlobOutputStore(account_url=account_url, connection_string=connection_string,
                           container=settings.task_log_container, create=create,
                           read_timeout=read_timeout)
