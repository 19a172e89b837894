"""Which control store a worker or ``jobq-ctl`` uses, from its Settings.

``--control auto`` (the default):

* SQLite backend: tables in the queue's own database file.
* Storage Queue: Table Storage in the same account -- the same connection string (it must
  name the account, or carry a ``TableEndpoint=``) or the same ``DefaultAzureCredential``
  with the account URL's ``queue`` host turned into its ``table`` host.
* Service Bus: only with ``--control-account-url`` or ``--control-connection-string``
  (``JOBQ_CONTROL_CONNECTION_STRING``); without one there is no control store.

``--control-account-url`` / ``--control-connection-string`` name the store explicitly on any
Azure backend. ``--control off``: none. A connection string whose table endpoint could only
be guessed (a queue endpoint on a host that is not ``*.queue.core.windows.net``, such as an
emulator) gives no store rather than a guess: a worker must never talk to an address nobody
configured.

Main thread, at start (worker) or once per command (jobq-ctl). Raises ControlConfigError for
a configuration that can never work (the CLI exits 2).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Union
from urllib.parse import urlsplit, urlunsplit

from ...core.settings import named_account
from .base import ControlConfigError, ControlStore

if TYPE_CHECKING:
    from ...core.settings import Settings

log = logging.getLogger("jobq.control")


def _conn_fields(conn: str) -> dict[str, str]:
    fields: dict[str, str] = {}
    for part in conn.split(";"):
        key, sep, value = part.partition("=")
        if sep:
            fields[key.strip().lower()] = value.strip()
    return fields


def _table_conn(conn: str) -> Union[str, None]:
    """The connection string itself when the Table SDK can find the table service from it
    without a guess, else None."""
    f = _conn_fields(conn)
    if "tableendpoint" in f:
        return conn
    queue = f.get("queueendpoint")
    if queue:  # an explicit queue endpoint: only a real Azure one says where tables are
        host = urlsplit(queue).hostname or ""
        return conn if host.endswith(".queue.core.windows.net") and "accountname" in f \
            else None
    return conn if "accountname" in f and "usedevelopmentstorage" not in f else None


def table_endpoint(queue_account_url: str) -> str:
    """https://ACCOUNT.queue.core.windows.net[/...] -> https://ACCOUNT.table.core.windows.net"""
    parts = urlsplit(queue_account_url)
    host = parts.netloc
    labels = host.split(".")
    if len(labels) > 2 and labels[1] == "queue":
        labels[1] = "table"
        host = ".".join(labels)
    return urlunsplit((parts.scheme, host, "", parts.query, ""))


def control_store_description(settings: Settings) -> str:
    """Where the control store lives, for the start-up line (no secret)."""
    if settings.control == "off":
        return "off"
    if settings.backend == "sqlite" and not (settings.control_account_url
                                             or settings.control_connection_string):
        return f"sqlite {settings.sqlite_path}"
    if settings.control_account_url:
        return f"table storage {settings.control_account_url}"
    if settings.control_connection_string:
        return "table storage (control connection string)"
    if settings.backend == "storage-queue":
        return "table storage (the queue's account)"
    return "none"


def open_control_store(settings: Settings, create: bool = True) -> Union[ControlStore, None]:
    """The control store these settings name, or None when there is none (main thread).

    ``create=False`` (read-only jobq-ctl commands): a table that does not exist is not made.
    """
    if settings.control == "off":
        return None
    url, conn = named_account(settings)
    if settings.backend == "sqlite" and not (url or conn):
        from .sqlite import SqliteControlStore

        return SqliteControlStore(settings.sqlite_path, create=create)
    if not (url or conn) and settings.backend == "storage-queue":
        if settings.account_url:
            host = urlsplit(settings.account_url).hostname or ""
            if not host.endswith(".queue.core.windows.net"):
                log.info("control store: off -- cannot tell the table endpoint of %s (set "
                         "--control-account-url)", settings.account_url)
                return None
            url = table_endpoint(settings.account_url)
        elif settings.connection_string:
            conn = _table_conn(settings.connection_string)
            if conn is None:
                log.info("control store: off -- the connection string names no table "
                         "endpoint (set --control-connection-string or "
                         "--control-account-url)")
                return None
    if not (url or conn):
        return None
    from .azure_table import AzureTableControlStore

    if url:
        if not urlsplit(url).scheme.startswith("http"):
            raise ControlConfigError(f"--control-account-url: not an http(s) URL: {url!r}")
        return AzureTableControlStore(account_url=url, create=create)
    return AzureTableControlStore(connection_string=conn, create=create)
