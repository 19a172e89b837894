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

from ...core.settings import named_account
from .base import OutputConfigError, OutputStore

if TYPE_CHECKING:
    from ...core.settings import Settings

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


def _fields(conn: str) -> dict[str, str]:
    fields: dict[str, str] = {}
    for item in conn.split(";"):
        key, sep, value = item.partition("=")
        if sep:
            fields[key.strip().lower()] = value.strip()
    return fields


def blob_connection_string(conn: str) -> Union[str, None]:
    """The connection string itself when the Blob SDK can find the blob service from it
    without a guess, else None."""
    fields = _fields(conn)
    if "blobendpoint" in fields:
        return conn
    if "accountname" not in fields or "usedevelopmentstorage" in fields:
        return None
    for endpoint in ("queueendpoint", "tableendpoint", "fileendpoint"):
        host = urlsplit(fields.get(endpoint, "")).hostname
        if host is not None and not host.endswith(".core.windows.net"):
            return None  # an emulator or proxy: where its blobs are nobody said
    return conn


# Where a worker's output goes: a store made at once (files: cheap), or the blob account's
# (URL, connection string), exactly one of them set.
_Target = Union[OutputStore, tuple[Union[str, None], Union[str, None]], None]


def open_output_store(settings: Settings, create: bool = True,
                      read_timeout: float = 10.0) -> Union[OutputStore, None]:
    """The output store these settings name, or None (main thread; raises OutputConfigError
    for a configuration that can never work).  ``create=False``: nothing is created.
    ``read_timeout``: per blob call (jobq-ctl passes less, to fail within 10 s in all)."""
    target = _target(settings)
    if target is None or not isinstance(target, tuple):
        return target
    url, conn = target
    from .azure_blob import BlobOutputStore

    return BlobOutputStore(account_url=url, connection_string=conn,
                           container=settings.task_log_container, create=create,
                           read_timeout=read_timeout)


def describe_output_store(settings: Settings) -> Union[str, None]:
    """What ``open_output_store`` would open, as its repr, or None (main thread, at start;
    raises like it).  Imports no storage SDK: the Blob SDK took ~60 ms of every Azure
    worker's start on the main thread, before its first task; the output-store thread
    imports it when it opens the store."""
    target = _target(settings)
    if target is None:
        return None
    if not isinstance(target, tuple):  # a file store: cheap to open, so opened to name it
        target.close()
        return repr(target)
    url, conn = target
    if url:
        endpoint = url.split("?", 1)[0].rstrip("/")
    else:
        fields = _fields(conn or "")
        endpoint = fields.get("blobendpoint") or (
            f"{fields.get('defaultendpointsprotocol', 'https')}://"
            f"{fields.get('accountname', '')}.blob."
            f"{fields.get('endpointsuffix', 'core.windows.net')}")
    return f"BlobOutputStore({endpoint.rstrip('/') + '/' + settings.task_log_container!r})"


def _target(settings: Settings) -> _Target:
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
        return blob_url, None
    if conn:
        blob_conn = blob_connection_string(conn)
        if blob_conn is None:
            log.info("output store: off -- the connection string names no blob endpoint "
                     "(add BlobEndpoint=)")
            return None
        return None, blob_conn
    return None
