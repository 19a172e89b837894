"""Signatures on control records (cancel, queue flag, command), like those on tasks.

``sig`` is ``{"kid": "<8 hex>", "mac": "<64 hex>"}``: HMAC-SHA256 with a signing key
(security.SigningKey; ``kid`` = security.key_id) over the canonical text of the record --
its document (records.to_doc) without ``sig``, keys sorted, no whitespace, UTF-8.  The
document holds the kind, the queue, the task id or the worker and the time, so a signature
cannot be moved to another task, queue, worker or kind.  Worker and result records are not
signed: workers write them, and nothing acts on them.

With keys configured, a worker acts only on records that ``verify`` accepts; ``Gate`` does
that and logs each refused record once.  jobq-ctl signs with the first key.
Pure functions; ``Gate`` is used by one thread (the control thread).
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Sequence
from dataclasses import replace
from typing import TypeVar, Union

from ...worker.task_guard import SigningKey
from .base import OnceLog, row_of
from .records import Cancel, Command, QueueFlag, to_doc

Signable = Union[Cancel, QueueFlag, Command]
S = TypeVar("S", Cancel, QueueFlag, Command)


def canonical(record: Signable) -> bytes:
    doc = to_doc(record)
    doc.pop("sig", None)
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False).encode("utf-8")


def _mac(secret: bytes, record: Signable) -> str:
    return hmac.new(secret, canonical(record), hashlib.sha256).hexdigest()


def sign(record: S, key: SigningKey) -> S:
    """The record with a fresh ``sig`` by ``key`` (jobq-ctl)."""
    return replace(record, sig={"kid": key.kid, "mac": _mac(key.secret, record)})


def verify(record: Signable, keys: Sequence[SigningKey]) -> Union[str, None]:
    """None if ``record`` carries a valid signature by one of ``keys``, else why not."""
    sig = record.sig
    if sig is None:
        return "unsigned"
    key = {k.kid: k for k in keys}.get(sig.get("kid", ""))
    if key is None:
        return f"unknown key id {sig.get('kid', '')[:16]!r}"
    mac = sig.get("mac", "")
    # compare_digest wants ASCII on both sides: a non-ASCII mac is simply a mismatch
    if not mac.isascii() or not hmac.compare_digest(_mac(key.secret, record), mac.lower()):
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

    def filter(self, records: Sequence[S]) -> list[S]:
        return [r for r in records if self.accepts(r)]
