"""Which backend the options a user gave name (both commands; main thread, once per parse).

``--backend`` has a default (sqlite), so an option of another backend given without it --
``--postgres-url`` alone -- used to serve a local ``./jobq.db`` while the user meant the
server.  Here a backend's own option selects that backend, and an option of one backend
given beside another backend (``--backend``, or another backend's option) is a usage error
naming both.  Only values a user set count, from a flag, ``JOBQ_<NAME>`` or the INI file:
never a default, never an empty value (an exported but empty variable means "unset").

``GivenStore`` marks each value argparse stores on the namespace (``given_options``
reads the marks); ``choose_backend`` decides, naming each option by where it was set
(``Sources``).  A ``--backend`` overrides the backend options set below its precedence (a
shared INI file's ``sqlite-path`` under ``--backend postgres`` on the command line) as it
overrides the file's ``backend``; at its precedence or above they conflict.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import Any

from .settings import BACKENDS, SettingsError

AZURE = ("storage-queue", "servicebus")
# The options that belong to some backends only (their dest -> those backends).  Shared ones
# (--queue, --lock-duration, the control store's) and the ones of several backends
# (--retention, --stale-lock-age: SQLite and PostgreSQL) name none.
BACKEND_OPTIONS: dict[str, tuple[str, ...]] = {
    "sqlite_path": ("sqlite",),
    "postgres_url": ("postgres",),
    "postgres_schema": ("postgres",),
    "postgres_notify": ("postgres",),
    "account_url": ("storage-queue",),
    "namespace": ("servicebus",),
    "connection_string": AZURE,  # which one: the string says (connection_string_backend)
}
_MARK = "jobq_given_"  # namespace attribute prefix: one per dest, so sub-parsers merge them

# Keys of a connection string that only one of the Azure services uses.  ``Endpoint=sb://``
# is Service Bus's; ``SharedAccessSignature`` is in both services' strings, so it says
# nothing.
_STORAGE_KEYS = ("accountname", "accountkey", "defaultendpointsprotocol", "endpointsuffix",
                 "queueendpoint", "blobendpoint", "tableendpoint", "fileendpoint",
                 "usedevelopmentstorage")
_SERVICEBUS_KEYS = ("entitypath", "sharedaccesskeyname", "sharedaccesskey",
                    "usedevelopmentemulator")


class GivenStore(argparse._StoreAction):
    """``store``, and a mark on the namespace that a value was given (by a flag, or the
    environment or INI file, which configargparse turns into flags)."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        super().__call__(parser, namespace, values, option_string)
        setattr(namespace, _MARK + self.dest, option_string or self.dest)


def given_options(ns: argparse.Namespace) -> dict[str, str]:
    """dest -> the flag it was given as, for every marked option with a non-empty value."""
    return {name[len(_MARK):]: flag for name, flag in vars(ns).items()
            if name.startswith(_MARK) and getattr(ns, name[len(_MARK):], None) not in (None, "")}


def connection_string_backend(text: str) -> str | None:
    """``storage-queue`` or ``servicebus`` when the connection string's keys say which, else
    None (neither or both kinds of keys)."""
    keys: dict[str, str] = {}
    for part in text.split(";"):
        key, _, value = part.partition("=")
        keys[key.strip().lower()] = value.strip().lower()
    storage = any(k in keys for k in _STORAGE_KEYS)
    servicebus = any(k in keys for k in _SERVICEBUS_KEYS) or keys.get(
        "endpoint", "").startswith("sb://")
    if storage != servicebus:
        return "storage-queue" if storage else "servicebus"
    return None


def _owners(dest: str, ns: argparse.Namespace) -> tuple[str, ...]:
    if dest == "connection_string":
        kind = connection_string_backend(str(ns.connection_string))
        return (kind,) if kind else AZURE
    return BACKEND_OPTIONS[dest]


def _kind(dest: str, owners: tuple[str, ...]) -> str:
    if owners == AZURE:
        return "an Azure (storage-queue or servicebus) option"
    return f"a {owners[0]} {'connection string' if dest == 'connection_string' else 'option'}"


# Where a value was set, by precedence (configargparse's: flag > environment > INI file).
INI, ENV, FLAG = 1, 2, 3


class Sources:
    """Where each given option was set: ``label(dest)`` names it as the user wrote it
    (``--sqlite-path``, ``JOBQ_SQLITE_PATH``, ``sqlite-path (FILE line N)``), ``rank(dest)``
    is its precedence.  Built from configargparse's ``get_source_to_settings_dict()`` (the
    environment and INI values it took) and the INI file's ``origins`` (key -> file, line);
    anything else came from the command line (``given``: the flag each was given as)."""

    def __init__(self, sources: Mapping[str, Mapping[str, tuple[Any, Any]]],
                 origins: Mapping[str, tuple[str, int]], given: Mapping[str, str]) -> None:
        self.given = given
        self.where: dict[str, tuple[str, int]] = {}
        for source, settings in sources.items():
            for key, (action, _) in settings.items():
                dest = getattr(action, "dest", None)
                if dest is None or dest in self.where:
                    continue
                if source == "environment_variables":
                    self.where[dest] = (key, ENV)
                elif source.startswith("config_file") and key in origins:
                    name, line = origins[key]
                    self.where[dest] = (f"{key} ({name} line {line})", INI)

    def label(self, dest: str) -> str:
        if dest in self.where:
            return self.where[dest][0]
        return self.given.get(dest) or "--" + dest.replace("_", "-")

    def rank(self, dest: str) -> int:
        return self.where[dest][1] if dest in self.where else FLAG


def choose_backend(ns: argparse.Namespace, sources: Sources) -> str:
    """The backend ``ns`` means (one line SettingsError when it cannot be told).

    ``--backend`` when given: each backend option given at its precedence or above must be
    one of its; one from below it (``sqlite-path`` in the INI file, ``--backend postgres`` on
    the command line) is overridden with the file's backend and ignored, so that a shared
    INI file (conf/worker.ini says ``backend = sqlite``) still serves with another backend
    named on the command line.  Without ``--backend``: the one backend every given backend
    option belongs to, else the default."""
    label = sources.label
    given = sources.given  # given_options(ns), read once by the caller
    owned = {dest: _owners(dest, ns) for dest in BACKEND_OPTIONS if dest in given}
    backend = str(ns.backend)
    if "backend" in given:
        floor = sources.rank("backend")
        for dest, owners in owned.items():
            if backend not in owners and sources.rank(dest) >= floor:
                raise SettingsError(f"{label(dest)} is {_kind(dest, owners)}, but "
                                    f"{label('backend')} is {backend}")
        return backend
    if not owned:
        return backend
    common = set(BACKENDS)
    seen: list[str] = []
    for dest, owners in owned.items():
        if not common & set(owners):
            other = next((d for d in seen if not set(owned[d]) & set(owners)), seen[0])
            raise SettingsError(
                f"{label(other)} is {_kind(other, owned[other])} and {label(dest)} "
                f"{_kind(dest, owners)}: give the options of one backend (and --backend)")
        common &= set(owners)
        seen.append(dest)
    if len(common) > 1:
        raise SettingsError(
            f"{label('connection_string')}: cannot tell a Storage Queue connection string "
            "(AccountName=, QueueEndpoint=) from a Service Bus one (Endpoint=sb://): give "
            "--backend storage-queue or --backend servicebus")
    return common.pop()
