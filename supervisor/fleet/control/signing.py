"""Signatures on control records (cancel, queue flag, command; audit), like those on tasks.

``sig`` is ``{"kid": "<8 hex>", "mac": "<64 hex>"}``: the MAC of core/signing.py, as tasks
have it (HMAC-SHA256 with a ``SigningKey``, named by its ``kid``), over the canonical text of
the record -- its document (records.to_doc) without ``sig``, keys sorted, no whitespace, UTF-8.  The
document holds the kind, the queue, the task id or the worker and the time, so a signature
cannot be moved to another task, queue, worker or kind; a worker acts only on the records
that name its own queue (fleet/directives.py), wherever in the store it found them.  An
audit record is signed too, so that a reader of the log can tell an action by a key holder
(nothing acts on it).
Worker and result records are not signed: workers write them, and nothing acts on them.

With keys configured, a worker acts only on records that ``verify`` accepts; ``Gate`` does
that and logs each refused record once.  jobq-ctl signs with the first key.
Pure functions; ``Gate`` is used by one thread (the control thread).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace
from typing import TypeVar, Union

from ...core.signing import SigningKey, key_of, mac, mac_matches
from .base import OnceLog, row_of
from .records import AuditRecord, Cancel, Command, QueueFlag, to_doc

Signable = Union[Cancel, QueueFlag, Command]  # what a worker acts on (Gate)
Signed = Union[Signable, AuditRecord]
S = TypeVar("S", Cancel, QueueFlag, Command, AuditRecord)
G = TypeVar("G", Cancel, QueueFlag, Command)


def canonical(record: Signed) -> bytes:
    doc = to_doc(record)
    doc.pop("sig", None)
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False).encode("utf-8")


def sign(record: S, key: SigningKey) -> S:
    """The record with a fresh ``sig`` by ``key`` (jobq-ctl)."""
    return replace(record, sig={"kid": key.kid, "mac": mac(key, canonical(record))})


def verify(record: Signed, keys: Sequence[SigningKey]) -> Union[str, None]:
    """None if ``record`` carries a valid signature by one of ``keys``, else why not."""
    sig = record.sig
    if sig is None:
        return "unsigned"
    key = key_of(sig.get("kid", ""), keys)
    if key is None:
        return f"unknown key id {sig.get('kid', '')[:16]!r}"
    if not mac_matches(key, canonical(record), sig.get("mac", "")):
        return "tampered (MAC mismatch)"
    return None


class Gate:
    """What a worker may act on.  Without keys everything passes (records are data, never
    commands to run, so an unsigned record can at most cancel, pause or stop)."""

    def __init__(self, keys: Sequence[SigningKey], once: Union[OnceLog, None] = None) -> None:
        self.keys = tuple(keys)
        self._once = once or OnceLog()

    def accepts(self, record: Signable) -> bool:
        if not self.keys:
            return True
        reason = verify(record, self.keys)
        if reason is None:
            return True
        self._once.warn(("sig", record.kind, record.queue, row_of(record), record.when),
                        "control: ignored %s record %s of queue %s: signature %s",
                        record.kind, row_of(record), record.queue, reason)
        return False

    def filter(self, records: Sequence[G]) -> list[G]:
        return [r for r in records if self.accepts(r)]
