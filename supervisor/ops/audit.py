"""The audit log of operator actions, as data: one AuditRecord per action made with
``jobq-ctl`` (ctl/actions_command.py) or the dashboard (dashboard/data.py), worded here for both
so that the Actions page and ``jobq-ctl actions`` read alike (docs/architecture.rst, "The
fleet layer").  Pushing tasks is not an operator action on the fleet and is not recorded.
The caller's thread (jobq-ctl's main thread, a dashboard request thread).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypedDict

from ..core.signing import SigningKey
from ..fleet.control.base import ControlStore
from ..fleet.control.records import AuditRecord, new_seq
from ..fleet.control.signing import sign, verify
from . import fleet
from .times import iso_or_none

IDS_SHOWN = 20  # ids named in one record's detail; the rest are counted
REASON_CHARS = 200
VIA_CTL = "jobq-ctl"
VIA_DASHBOARD = "dashboard"


class ActionJson(TypedDict):
    """One action as ``jobq-ctl actions --json`` prints it and /api/actions serves it."""

    when: str | None
    who: str
    via: str
    action: str
    detail: str
    signature: str | None


def ids_text(ids: Sequence[str]) -> str:
    """The first IDS_SHOWN ids, then how many more: one readable line."""
    more = len(ids) - IDS_SHOWN
    return " ".join(ids[:IDS_SHOWN]) + (f" and {more} more" if more > 0 else "")


def tasks_text(ids: Sequence[str], done: int | None = None, what: str = "tasks",
               reason: str = "") -> str:
    """An action's tasks: one id as it is; several as "N <what>: <ids>" ("D of N ..." with
    ``done``: the action applied to D of them); ``reason``: the operator's, after the ids."""
    if len(ids) == 1 and done in (None, 1):
        text = ids[0]
    else:
        count = f"{len(ids)}" if done is None else f"{done} of {len(ids)}"
        text = f"{count} {what}: {ids_text(ids)}"
    return text + (f" (reason: {reason[:REASON_CHARS]})" if reason else "")


def count_text(n: int, what: str) -> str:
    """An action on tasks it does not name (clear, prune): how many, of what."""
    return f"{n} {what}"


def audit_record(queue: str, action: str, detail: str, by: str, via: str,
                 key: SigningKey | None, when: float | None = None) -> AuditRecord:
    """The record of one action, signed with ``key`` as the operator's other records are
    (fleet/control/signing.py) when one is given."""
    when = fleet.clock() if when is None else when
    record = AuditRecord(queue=queue, seq=new_seq(when), who=by, action=action,
                         detail=" ".join(detail.split()), when=when, via=via)
    return sign(record, key) if key is not None else record


def record_action(store: ControlStore, queue: str, action: str, detail: str, by: str,
                  via: str, key: SigningKey | None, when: float | None = None) -> None:
    """Keep one operator action in ``store`` (raises ControlStoreError: the callers decide
    what a store that is down means -- for both, the action stands)."""
    store.put_audit(audit_record(queue, action, detail, by, via, key, when))


def signature_text(record: AuditRecord, keys: Sequence[SigningKey]) -> str | None:
    """None for an unsigned record; else its key id, checked against ``keys`` when any."""
    if record.sig is None:
        return None
    kid = record.sig.get("kid", "")[:16]
    if not keys:
        return f"key {kid}"
    why = verify(record, keys)
    return f"key {kid}: valid" if why is None else f"key {kid}: {why}"


def actions_json(records: Sequence[AuditRecord], keys: Sequence[SigningKey] = ()
                 ) -> list[ActionJson]:
    """The actions, in the stores' order (newest first)."""
    return [{"when": iso_or_none(a.when), "who": a.who, "via": a.via, "action": a.action,
             "detail": a.detail, "signature": signature_text(a, keys)} for a in records]
