"""What the two stores in an Azure storage account share -- the control store's table
(fleet/control/azure_table.py) and the output store's container (fleet/output/azure_blob.py):
how an SDK client is made (no SDK retries, explicit timeouts, the credential), creating the
table or container when it is missing, and the service's error code of an SDK exception
(the Storage Queue backend's too).  Called on the thread that owns the store.  Which account
and endpoint the stores use: fleet/storage_account.py.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, TypeVar, Union

from azure.core.exceptions import ClientAuthenticationError, ResourceExistsError

# What a data-only role gets for a create: an administrator may well have made it already.
NOT_ALLOWED_TO_CREATE = ("AuthorizationPermissionMismatch", "AuthorizationResourceTypeMismatch",
                         "AuthorizationFailure")
E = TypeVar("E", bound=Exception)


def error_code(exc: BaseException) -> str:
    """The service's error code of an SDK exception (``QueueNotFound``...), "" if none (any
    thread): the Storage Queue backend and both stores match on it."""
    code = getattr(exc, "error_code", None)
    return str(getattr(code, "value", code) or "")


def sdk_client(client_type: Any, *, connection_string: Union[str, None],
               account_url: Union[str, None], credential: object, connect_timeout: float,
               read_timeout: float, sas_as_credential: bool = False, **kwargs: object) -> Any:
    """A ``client_type`` (TableClient, ContainerClient) from exactly one of
    ``connection_string`` or ``account_url`` (the store's thread).  Without ``credential`` an
    account URL uses its SAS or, without one, DefaultAzureCredential; ``sas_as_credential``:
    the SAS goes to the client as a credential, not in the URL.  No SDK retries: a dead store
    fails within the timeouts.  A malformed string or URL raises ValueError or TypeError."""
    options = {"retry_total": 0, "connection_timeout": connect_timeout,
               "read_timeout": read_timeout, **kwargs}
    if connection_string:
        return client_type.from_connection_string(connection_string, **options)
    assert account_url is not None
    if credential is None and "?" not in account_url:
        from azure.identity import DefaultAzureCredential  # only this path needs it

        credential = DefaultAzureCredential()
    if credential is None and sas_as_credential:
        from azure.core.credentials import AzureSasCredential

        account_url, _, sas = account_url.partition("?")
        credential = AzureSasCredential(sas)
    return client_type(account_url, credential=credential, **options)


def create_if_missing(create: Callable[[], object], *, store: str, kind: str, name: str,
                      errors: tuple[type[BaseException], ...],
                      fail: Callable[[str, BaseException], Exception],
                      log: logging.Logger) -> None:
    """Run ``create``, which makes the ``kind`` (table, container) ``name`` of ``store``
    (the store's thread).  One that exists already is fine, and so is a role not allowed to
    create (a warning).  Another of ``errors`` is raised as ``fail("create <kind>", exc)``."""
    try:
        create()
    except ResourceExistsError:
        pass
    except errors as exc:
        if error_code(exc) in NOT_ALLOWED_TO_CREATE:
            log.warning("%s: not allowed to create %s %s; assuming it exists", store, kind, name)
            return
        raise fail(f"create {kind}", exc) from None


def store_error(exc: BaseException, doing: str, detail: str, refused: Callable[[str], E],
                failed: Callable[[str], E]) -> E:
    """The store's error for an SDK call's ``exc`` (the store's thread): ``refused`` (a
    configuration error) when the credential is not authorized, else ``failed``.  ``doing``:
    e.g. ``"control store write worker"``; ``detail``: the scrubbed exception text."""
    status = getattr(getattr(exc, "response", None), "status_code", None)
    if isinstance(exc, ClientAuthenticationError) or status in (401, 403):
        return refused(f"{doing}: not authorized: {detail}")
    return failed(f"{doing}: {detail}")
