"""Which output store a worker or ``jobq-ctl`` uses, from its Settings (main thread).

The output store lives beside the control store (fleet/control/open.py): a SQLite queue's in files
beside its database (files.py); an Azure control store's in blob container
``--task-log-container`` of the same storage account (fleet/output/azure_blob.py); a
PostgreSQL queue's in tables of its own schema (fleet/output/postgres.py; unless ``--control
off``).  No control store, no output store.

The blob endpoint is derived by the rule fleet/control/open.py derives the table endpoint by
(fleet/storage_account.py), and never guessed: an account URL's ``ACCOUNT.table`` or
``ACCOUNT.queue`` host becomes ``ACCOUNT.blob.core.windows.net`` (another host, such as an
emulator's, gives no store); a connection string is used when it names a ``BlobEndpoint=`` or
a real account (an account name, no development storage, and no explicit endpoint outside
``*.core.windows.net``).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Union
from urllib.parse import urlsplit

from ..storage_account import conn_fields, fleet_account, service_connection_string, service_url
from .base import OutputConfigError, OutputStore, Watchable

if TYPE_CHECKING:
    from ...core.settings import Settings

log = logging.getLogger("jobq.output")


# Where a worker's output goes: a store made at once (files, PostgreSQL: cheap, no call
# made), or the blob account's
# (URL, connection string), exactly one of them set.
_Target = Union[OutputStore, tuple[Union[str, None], Union[str, None]], None]


def open_output_store(settings: Settings, create: bool = True,
                      read_timeout: float = 10.0) -> Union[OutputStore, None]:
    """The output store these settings name, or None (main thread; raises OutputConfigError
    for a configuration that can never work).  ``create=False``: nothing is created.
    ``read_timeout``: per blob call or PostgreSQL statement (jobq-ctl passes less, to fail
    within 10 s in all)."""
    target = _target(settings, read_timeout, create)
    if target is None or not isinstance(target, tuple):
        return target
    url, conn = target
    from .azure_blob import BlobOutputStore

    return BlobOutputStore(account_url=url, connection_string=conn,
                           container=settings.task_log_container, create=create,
                           read_timeout=read_timeout)


def open_output_pushes(settings: Settings) -> Union[Watchable, None]:
    """What pushes writes of tasks' output and results to jobq-ctl's followers (base.Watchable:
    PostgreSQL's output store, whose ``watch`` is None with ``--postgres-notify off``), or
    None: they poll (main thread; nothing is connected, no SDK imported)."""
    if settings.backend != "postgres":
        return None
    target = _target(settings, create=False)
    return target if isinstance(target, Watchable) else None


def pushes_output(settings: Settings) -> bool:
    """Whether readers of this worker's output are pushed its writes (PostgreSQL with
    NOTIFY): the output-store thread then writes more often (fleet/shipper.py)."""
    return (settings.backend == "postgres" and settings.control != "off"
            and settings.postgres_notify == "on")


def describe_output_store(settings: Settings) -> Union[str, None]:
    """What ``open_output_store`` would open, as its repr, or None (main thread, at start;
    raises like it).  Imports no storage SDK: the Blob SDK took ~60 ms of every Azure
    worker's start on the main thread, before its first task; the output-store thread
    imports it when it opens the store."""
    target = _target(settings)
    if target is None:
        return None
    if not isinstance(target, tuple):  # files, PostgreSQL: cheap to make (no call, no SDK)
        target.close()
        return repr(target)
    url, conn = target
    if url:
        endpoint = url.split("?", 1)[0].rstrip("/")
    else:
        fields = conn_fields(conn or "")
        endpoint = fields.get("blobendpoint") or (
            f"{fields.get('defaultendpointsprotocol', 'https')}://"
            f"{fields.get('accountname', '')}.blob."
            f"{fields.get('endpointsuffix', 'core.windows.net')}")
    return f"BlobOutputStore({endpoint.rstrip('/') + '/' + settings.task_log_container!r})"


def _target(settings: Settings, read_timeout: float = 10.0, create: bool = True) -> _Target:
    if settings.control == "off":
        return None
    if settings.backend == "postgres":  # connects at its first call, on its thread
        from .postgres import PostgresOutputStore

        notify = settings.postgres_notify == "on"
        return PostgresOutputStore(settings.postgres_url, settings.postgres_schema,
                                   create=create, timeout=read_timeout, prepare=notify,
                                   notify=notify)
    account = fleet_account(settings)
    if settings.backend == "sqlite" and account is None:
        from .files import FileOutputStore, output_dir

        return FileOutputStore(output_dir(settings.sqlite_path))
    if account is None:
        return None
    url, conn = account.account_url, account.connection_string
    if url:
        if not urlsplit(url).scheme.startswith("http"):
            raise OutputConfigError(f"output store: not an http(s) URL: {url!r}")
        blob_url = service_url(url, "blob")
        if blob_url is None:
            log.info("output store: off -- cannot tell the blob endpoint of %s",
                     url.split("?", 1)[0])
            return None
        return blob_url, None
    assert conn is not None
    blob_conn = service_connection_string(conn, "blob")
    if blob_conn is None:
        log.info("output store: off -- the connection string names no blob endpoint "
                 "(add BlobEndpoint=)")
        return None
    return None, blob_conn
