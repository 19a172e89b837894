"""HMAC signing keys and the one MAC both kinds of signature use: tasks (here) and control
records (fleet/control/signing.py).  The two differ only in the canonical text the MAC covers.

A key file holds the key bytes; one trailing newline is stripped.  ``kid`` is the first 8 hex
digits of sha256(key): it names the key without revealing it, so a worker configured with
several keys (rotation) picks the right one.  ``mac`` is HMAC-SHA256 with the key over the
canonical text, as 64 lower-case hex digits.

Signed tasks.  ``jobq-ctl push --signing-key-file F`` adds, at the top level of the ai4s-jobq
envelope (never inside ``kwargs``, which ai4s-jobq's worker checks strictly)::

    "jobq_sig": {"v": 2, "kid": "<8 hex>", "iat": <epoch seconds>, "queue": "<name>",
                 "mac": "<64 hex>"}

over the canonical form of the task: the JSON text, keys sorted and no whitespace, of
``{"cmd", "env", "cwd", "id", "iat", "queue"}`` plus the scheduling fields that are set
(``priority``, ``not_before``, ``timeout``, ``unique_key``).  Not covered by the MAC: the
attempt bookkeeping (``num_retries``, ``jobq_max_attempts``, ``jobq_preemptions``) that
workers rewrite in flight.  A worker checks it in ``TaskGuard.refusal`` (worker/task_guard.py)
against the queue the message was received from, so a task signed for one queue does not run
when moved into another that trusts the same key (issue 39).

Version 1 (no ``v``, no ``queue``: jobq-ctl before issue 39) signs the same fields without the
queue.  Such a signature verifies only with ``accept_unbound`` (the worker's
``--accept-queue-unbound-signatures``, for the duration of an upgrade): a version 2 signature
stripped down to look like version 1 does not verify, since its MAC covered the queue.

Keys are read on the main thread at start (worker) or once per command (jobq-ctl); the rest
are pure functions, any thread.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from .task import DEFAULT_PRIORITY, Task

SIG_FIELD = "jobq_sig"
SIG_PREFIX = "signature invalid"
SIG_VERSION = 2  # jobq_sig "v": the queue is signed (1: no "v", queue-unbound)
UNBOUND_OPTION = "--accept-queue-unbound-signatures"
FUTURE_SKEW = 300.0  # with --max-task-age, an issued-at this far in the future is refused


class SecurityConfigError(ValueError):
    """A security option that cannot work: one line naming the option (exit status 2)."""


# -------------------------------------------------------------------------------- keys
@dataclass(frozen=True)
class SigningKey:
    kid: str
    secret: bytes = field(repr=False)
    path: str = ""


def key_id(secret: bytes) -> str:
    return hashlib.sha256(secret).hexdigest()[:8]


def split_paths(values: Sequence[str] | None) -> list[str]:
    """Flag values, each possibly a comma-separated list (how the environment variable and the
    INI file give several), -> paths in order."""
    out: list[str] = []
    for value in values or ():
        out += [p.strip() for p in str(value).split(",") if p.strip()]
    return out


def load_key(path: str, option: str = "--signing-key-file") -> SigningKey:
    """Read one key file (main thread, at start).  Raises SecurityConfigError."""
    try:
        with open(path, "rb") as fh:
            secret = fh.read()
    except OSError as exc:
        raise SecurityConfigError(f"{option}: cannot read {path}: {exc.strerror}") from None
    if secret.endswith(b"\r\n"):
        secret = secret[:-2]
    elif secret.endswith(b"\n"):
        secret = secret[:-1]
    if not secret:
        raise SecurityConfigError(f"{option}: {path} is empty")
    return SigningKey(kid=key_id(secret), secret=secret, path=path)


def load_keys(values: Sequence[str] | None) -> list[SigningKey]:
    return [load_key(p) for p in split_paths(values)]


# ----------------------------------------------------------------------------- the MAC
def mac(key: SigningKey, text: bytes) -> str:
    """HMAC-SHA256 of the canonical ``text`` with ``key``, in hex."""
    return hmac.new(key.secret, text, hashlib.sha256).hexdigest()


def key_of(kid: str, keys: Sequence[SigningKey]) -> SigningKey | None:
    """The key of ``keys`` that ``kid`` names, or None."""
    return {k.kid: k for k in keys}.get(kid)


def mac_matches(key: SigningKey, text: bytes, given: str) -> bool:
    """Whether ``given`` is the MAC of ``text`` with ``key`` (upper-case hex too), in constant
    time."""
    # compare_digest wants both str ASCII-only: a non-ASCII mac is simply a mismatch
    return given.isascii() and hmac.compare_digest(mac(key, text), given.lower())


# ------------------------------------------------------------------------ signed tasks
def canonical(task: Task, iat: int, queue: str | None) -> bytes:
    """The bytes the MAC covers: sorted-key, whitespace-free JSON of cmd, env, cwd, id, iat,
    the queue (None: a version 1 signature, which has none), and of the scheduling fields a
    task carries (priority, not_before, timeout, unique_key), each only when set -- so a task
    without them signs as before, and one with them cannot have them changed (made to wait,
    or to jump the queue) without breaking the signature."""
    doc: dict[str, object] = {"cmd": task.cmd, "env": dict(task.env), "cwd": task.cwd,
                              "id": task.id, "iat": iat}
    if queue is not None:
        doc["queue"] = queue
    if task.priority != DEFAULT_PRIORITY:
        doc["priority"] = task.priority
    for name in ("not_before", "timeout", "unique_key"):
        if getattr(task, name) is not None:
            doc[name] = getattr(task, name)
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode("utf-8")


def sign_task(task: Task, key: SigningKey, now: float, *, queue: str) -> Task:
    """The task with a fresh ``jobq_sig`` for ``queue`` (jobq-ctl push, main thread)."""
    iat = int(now)
    return replace(task, signature={"v": SIG_VERSION, "kid": key.kid, "iat": iat,
                                    "queue": queue,
                                    "mac": mac(key, canonical(task, iat, queue))})


def verify(task: Task, keys: Sequence[SigningKey], max_age: float | None, now: float, *,
           queue: str, accept_unbound: bool = False) -> str | None:
    """None if the task carries a valid signature by one of ``keys`` for ``queue`` (the one
    the message was received from); else the refusal reason, which always starts with
    "signature invalid".  ``accept_unbound``: a version 1 signature (no queue) may pass."""
    sig = task.signature
    if sig is None:
        return f"{SIG_PREFIX}: no signature"
    if (not isinstance(sig, dict) or not isinstance(sig.get("kid"), str)
            or not isinstance(sig.get("mac"), str)
            or not isinstance(sig.get("iat"), int) or isinstance(sig.get("iat"), bool)):
        return f"{SIG_PREFIX}: malformed {SIG_FIELD}"
    version = sig.get("v", 1)
    if version not in (1, SIG_VERSION) or isinstance(version, bool):
        return f"{SIG_PREFIX}: unknown {SIG_FIELD} version {str(version)[:16]!r}"
    signed_for = sig.get("queue") if version == SIG_VERSION else None
    if version == SIG_VERSION and not isinstance(signed_for, str):
        return f"{SIG_PREFIX}: malformed {SIG_FIELD}"
    key = key_of(sig["kid"], keys)
    if key is None:
        return f"{SIG_PREFIX}: unknown key id {sig['kid'][:16]!r}"
    if not mac_matches(key, canonical(task, sig["iat"], signed_for), sig["mac"]):
        return f"{SIG_PREFIX}: tampered (MAC mismatch)"
    # after the MAC: the queue named is the signer's, so the reason may show it
    if signed_for is None and not accept_unbound:
        return (f"{SIG_PREFIX}: not bound to a queue (an older jobq-ctl signed it; push it "
                f"again, or see {UNBOUND_OPTION})")
    if signed_for is not None and signed_for != queue:
        return f"{SIG_PREFIX}: signed for queue {signed_for[:64]!r}, not {queue[:64]!r}"
    if max_age is not None:
        age = now - sig["iat"]
        if age > max_age:
            return f"{SIG_PREFIX}: expired (issued {age:.0f}s ago, --max-task-age {max_age:g}s)"
        if age < -FUTURE_SKEW:
            return f"{SIG_PREFIX}: issued {-age:.0f}s in the future"
    return None


def unbound_warning(accept_unbound: bool, keys: Sequence[SigningKey]) -> str | None:
    """The start-up warning of ``--accept-queue-unbound-signatures`` (None when off); a
    SecurityConfigError when it is on without keys (main thread, at start)."""
    if not accept_unbound:
        return None
    if not keys:
        raise SecurityConfigError(f"{UNBOUND_OPTION}: needs --signing-key-file")
    return (f"{UNBOUND_OPTION}: tasks signed without a queue (by an older jobq-ctl) run on "
            f"any queue that trusts their key; turn it off once every producer is upgraded "
            f"and the queues hold no such task (docs/security.rst)")
