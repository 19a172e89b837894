"""Which control store a worker or ``jobq-ctl`` uses, from its Settings.

``--control auto`` (the default):

* SQLite backend: tables in the queue's own database file.
* Storage Queue: Table Storage in the same account -- the same connection string (it must
  name the account, or carry a ``TableEndpoint=``) or the same ``DefaultAzureCredential``
  with the account URL's ``queue`` host turned into its ``table`` host
  (fleet/storage_account.py: the rule the output store's blob endpoint follows too).
* PostgreSQL: a table in the queue's own schema (fleet/control/postgres.py), on a
  connection of its own.
* Service Bus: only with ``--control-account-url`` or ``--control-connection-string``
  (``JOBQ_CONTROL_CONNECTION_STRING``); without one there is no control store.

``--control-account-url`` / ``--control-connection-string`` name the store explicitly on any
Azure backend. ``--control off``: none. A connection string whose table endpoint could only
be guessed (an endpoint on a host that is not ``*.core.windows.net``, such as an emulator's)
gives no store rather than a guess: a worker must never talk to an address nobody
configured.

Main thread, at start (worker) or once per command (jobq-ctl). Raises ControlConfigError for
a configuration that can never work (the CLI exits 2).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Union
from urllib.parse import urlsplit

from ..storage_account import fleet_account, service_connection_string, service_url
from .base import ControlConfigError, ControlStore

if TYPE_CHECKING:
    from ...core.settings import Settings

log = logging.getLogger("jobq.control")


def control_store_description(settings: Settings) -> str:
    """Where the control store lives, for the start-up line (no secret)."""
    if settings.control == "off":
        return "off"
    if settings.backend == "sqlite" and not (settings.control_account_url
                                             or settings.control_connection_string):
        return f"sqlite {settings.sqlite_path}"
    if settings.backend == "postgres" and not (settings.control_account_url
                                               or settings.control_connection_string):
        from ...backends.postgres.connect import describe

        return f"postgres schema {settings.postgres_schema} on {describe(settings.postgres_url)}"
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
    account = fleet_account(settings)
    if settings.backend == "sqlite" and account is None:
        from .sqlite import SqliteControlStore

        return SqliteControlStore(settings.sqlite_path, create=create)
    if settings.backend == "postgres" and account is None:
        from .postgres import PostgresControlStore

        return PostgresControlStore(settings.postgres_url, settings.postgres_schema,
                                    create=create, prepare=settings.postgres_notify == "on",
                                    notify=settings.postgres_notify == "on")
    if account is None:
        return None
    # A store named for the fleet is used as given; a Storage Queue's own account has its
    # table endpoint derived (storage_account.py).
    url, conn = account.account_url, account.connection_string
    if not account.named and url:
        url = service_url(url, "table")
        if url is None:
            log.info("control store: off -- cannot tell the table endpoint of %s (set "
                     "--control-account-url)", account.account_url)
            return None
    elif not account.named and conn:
        conn = service_connection_string(conn, "table")
        if conn is None:
            log.info("control store: off -- the connection string names no table "
                     "endpoint (set --control-connection-string or "
                     "--control-account-url)")
            return None
    from .azure_table import AzureTableControlStore

    if url:
        if not urlsplit(url).scheme.startswith("http"):
            raise ControlConfigError(f"--control-account-url: not an http(s) URL: {url!r}")
        return AzureTableControlStore(account_url=url, create=create)
    return AzureTableControlStore(connection_string=conn, create=create)
