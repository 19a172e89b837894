"""Which Azure storage account the fleet stores live in, and where each store's service is in
it: the one rule for the control store's table (fleet/control/open.py) and the output store's
blob container (output/open.py).

The account: the one named for the fleet stores (``--control-account-url``,
``--control-connection-string`` or JOBQ_CONTROL_CONNECTION_STRING), else a Storage Queue
backend's own; a Service Bus backend has none of its own.

A service's endpoint in it is never guessed -- a worker must never talk to an address nobody
configured:

* an account URL ``https://ACCOUNT.(queue|table|blob).core.windows.net[:port][/...][?sas]``
  becomes ``https://ACCOUNT.<service>.core.windows.net[:port][?sas]`` (host names compare
  without case, as DNS does); any other host -- an emulator, a proxy, another cloud -- has
  no such endpoint;
* a connection string is used when it names the service's endpoint (``TableEndpoint=``,
  ``BlobEndpoint=``), or else a real account: an account name, no development storage, and
  no explicit endpoint outside ``*.core.windows.net``.

Pure functions on strings and Settings; no SDK is imported (main thread, at start).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Union
from urllib.parse import urlsplit, urlunsplit

if TYPE_CHECKING:
    from ..core.settings import Settings

# The services whose host an account URL may name (an account's URLs differ only in it).
SERVICES = ("queue", "table", "blob")
_EXPLICIT = ("queueendpoint", "tableendpoint", "blobendpoint", "fileendpoint")


@dataclass(frozen=True)
class StorageAccount:
    """An account: exactly one of ``account_url`` and ``connection_string`` is set.
    ``named``: given for the fleet stores, not a Storage Queue's own."""

    account_url: Union[str, None]
    connection_string: Union[str, None]
    named: bool


def named_account(settings: Settings) -> Union[StorageAccount, None]:
    """The account named for the fleet stores, or None (any thread)."""
    conn = settings.control_connection_string or os.environ.get(
        "JOBQ_CONTROL_CONNECTION_STRING") or None
    url = settings.control_account_url
    if url:
        return StorageAccount(url, None, named=True)
    return StorageAccount(None, conn, named=True) if conn else None


def fleet_account(settings: Settings) -> Union[StorageAccount, None]:
    """The account of the fleet stores, named or the Storage Queue's own; None without one
    (a SQLite queue keeps its stores beside its file; Service Bus has none)."""
    named = named_account(settings)
    if named is not None or settings.backend != "storage-queue":
        return named
    if settings.account_url:
        return StorageAccount(settings.account_url, None, named=False)
    if settings.connection_string:
        return StorageAccount(None, settings.connection_string, named=False)
    return None


def service_url(account_url: str, service: str) -> Union[str, None]:
    """``service``'s endpoint of the account at ``account_url``, or None when the host does not
    say it (see the module docstring)."""
    parts = urlsplit(account_url)
    labels = (parts.hostname or "").split(".")
    if len(labels) != 5 or labels[1] not in SERVICES \
            or labels[2:] != ["core", "windows", "net"]:
        return None
    labels[1] = service
    host_port = parts.netloc.rpartition("@")[2]
    port = host_port.rpartition(":")[2] if ":" in host_port else ""
    netloc = ".".join(labels) + (f":{port}" if port else "")
    return urlunsplit((parts.scheme, netloc, "", parts.query, ""))


def conn_fields(conn: str) -> dict[str, str]:
    """A connection string's ``Key=value`` pairs, keys in lower case."""
    fields: dict[str, str] = {}
    for item in conn.split(";"):
        key, sep, value = item.partition("=")
        if sep:
            fields[key.strip().lower()] = value.strip()
    return fields


def service_connection_string(conn: str, service: str) -> Union[str, None]:
    """The connection string itself when the ``service`` SDK can find its endpoint from it
    without a guess, else None."""
    fields = conn_fields(conn)
    if f"{service}endpoint" in fields:
        return conn
    if "accountname" not in fields or "usedevelopmentstorage" in fields:
        return None
    for endpoint in _EXPLICIT:
        host = urlsplit(fields.get(endpoint, "")).hostname
        if host is not None and not host.endswith(".core.windows.net"):
            return None  # an emulator or proxy: where its other services are nobody said
    return conn
