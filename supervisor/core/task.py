"""Task: the message body -- parse, validate, serialize.

Wire format is the ai4s-jobq v1 envelope (plain JSON text)::

    {"version": 1, "reply_requested": false, "num_retries": 0, "id": "<hex>",
     "kwargs": "<JSON string of {cmd, env?, cwd?}>",
     "jobq_max_attempts": 5, "jobq_preemptions": 0,
     "jobq_sig": {"v": 2, "kid": "...", "iat": 1700000000, "queue": "...",
                  "mac": "<hex>"},   # only when signed (core/signing.py)
     "jobq_priority": 7, "jobq_not_before": 1700000000.0, "jobq_timeout": 2.0,
     "jobq_unique_key": "..."}   # scheduling (docs/backends.rst): each only when set

ai4s-jobq's worker rejects unknown keys inside ``kwargs``, so our own fields live at the top
level, where it ignores them; a body without one of them reads as its default (an older
jobq-ctl's or ai4s-jobq's), and an older reader ignores them.  Our simpler own format
``{"cmd": ..., "env": ..., "cwd": ...}`` is accepted on input too.  Nothing here raises
anything but TaskFormatError.
"""

from __future__ import annotations

import json
import os
import re
import uuid
from dataclasses import dataclass, field, replace
from typing import TypeVar

MAX_BODY_BYTES = 60 * 1024  # Storage Queue allows 64 KiB per message; keep headroom
MAX_COMMAND_BYTES = 32 * 1024
# A message asking for billions of attempts would keep a failing task cycling forever.
MAX_ATTEMPTS = 1000
V = TypeVar("V")
_KWARGS_KEYS = {"cmd", "env", "cwd", "bg_dirsync_to"}
DEFAULT_PRIORITY = 5
MAX_PRIORITY = 9
MAX_NOT_BEFORE = 95_617_584_000.0  # 5000-01-01 UTC, epoch seconds: later is a mistake
MAX_UNIQUE_KEY = 128  # Service Bus message ids hold at most 128 characters


MAX_ID = 128  # characters of a task id
# The ids producers make: jobq-ctl a uuid4, ai4s-jobq a uuid4 or an md5 of the body, both as
# 32 hex digits; a Storage Queue message id (which jobq-ctl requeue also takes) is a GUID.
_MADE_ID = re.compile(r"[0-9a-f]{32}|[0-9a-f]{8}(?:-[0-9a-f]{4}){3}-[0-9a-f]{12}", re.IGNORECASE)


def id_problem(task_id: str) -> str | None:
    """Why ``task_id`` cannot be the id of any task (the body's rule, _validate), or None."""
    if not task_id:
        return "an empty task id"
    if len(task_id) > MAX_ID:
        return f"a task id is at most {MAX_ID} characters, this one {len(task_id)}"
    # The id names the task's output, result records and JOBQ_TASK_ID: it must be text every
    # store can hold (no lone UTF-16 surrogate: "\\udcff" cannot be written as UTF-8).
    if "\x00" in task_id or not _storable(task_id):
        return "a task id must be text without NUL or lone UTF-16 surrogates"
    return None


def _storable(text: str) -> bool:
    """Whether ``text`` encodes as UTF-8 (what SQLite, PostgreSQL and JSON-over-HTTP take)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def prefix_end(prefix: str) -> str | None:
    """The smallest string above every string that starts with ``prefix`` in code point (and
    UTF-8 byte) order, for an index range ``prefix <= id < end``; None when there is none (a
    prefix of U+10FFFF only).  Steps over the surrogates, which no stored id holds."""
    for i in range(len(prefix) - 1, -1, -1):
        code = ord(prefix[i]) + 1
        if code == 0xD800:
            code = 0xE000
        if code <= 0x10FFFF:
            return prefix[:i] + chr(code)
    return None


def is_made_id(task_id: str) -> bool:
    """Is ``task_id`` shaped like an id jobq-ctl or ai4s-jobq makes (32 hex digits, a GUID)?
    Only a hand-written body has another id."""
    return _MADE_ID.fullmatch(task_id) is not None


class TaskFormatError(ValueError):
    """The message body is not a task we can run (poison)."""


def new_task_id() -> str:
    return uuid.uuid4().hex


@dataclass(frozen=True)
class Task:
    cmd: str
    id: str = field(default_factory=new_task_id)
    env: dict[str, str] = field(default_factory=dict)
    cwd: str | None = None
    max_attempts: int | None = None  # None: the worker's --max-attempts
    preemptions: int = 0  # times released by preemption (not counted as attempts)
    # ai4s-jobq's "retries left"; written as max_attempts - 1 so its worker retries alike
    num_retries: int = field(default=0, compare=False)
    # top-level "jobq_sig" as received or as added by signing.sign_task; verified (and its
    # shape checked) only by core/signing.py, so a malformed one is a refusal, not poison
    signature: object = field(default=None, compare=False)
    # scheduling (jobq-ctl push): 0..9, higher first (SQLite orders by it)
    priority: int = DEFAULT_PRIORITY
    not_before: float | None = None  # wall-clock epoch seconds it was pushed to wait for
    timeout: float | None = None  # seconds; the worker applies min(this, --task-time-limit)
    unique_key: str | None = None  # a push while a task with this key lives is skipped

    def __post_init__(self) -> None:
        _validate(self.cmd, self.env, self.cwd, self.max_attempts, self.id)
        _validate_schedule(self.priority, self.not_before, self.timeout, self.unique_key)

    def with_preemption(self) -> Task:
        return replace(self, preemptions=self.preemptions + 1)

    def to_json(self) -> str:
        """Serialize as the ai4s-jobq v1 envelope."""
        kwargs: dict[str, object] = {"cmd": self.cmd}
        if self.env:
            kwargs["env"] = dict(self.env)
        if self.cwd is not None:
            kwargs["cwd"] = self.cwd
        body: dict[str, object] = {
            "version": 1,
            "reply_requested": False,
            "kwargs": json.dumps(kwargs),
            "num_retries": self.max_attempts - 1 if self.max_attempts else self.num_retries,
            "id": self.id,
            "jobq_preemptions": self.preemptions,
            # present (maybe null) marks our own message: see _from_dict
            "jobq_max_attempts": self.max_attempts,
        }
        if self.signature is not None:
            body["jobq_sig"] = self.signature
        if self.priority != DEFAULT_PRIORITY:
            body["jobq_priority"] = self.priority
        for key, value in (("jobq_not_before", self.not_before), ("jobq_timeout", self.timeout),
                           ("jobq_unique_key", self.unique_key)):
            if value is not None:
                body[key] = value
        text = json.dumps(body)
        size = len(text.encode("utf-8"))
        if size > MAX_BODY_BYTES:
            raise TaskFormatError(f"task body is {size} bytes, more than {MAX_BODY_BYTES}")
        return text

    @classmethod
    def parse(cls, body: str | bytes) -> Task:
        """Parse a message body; raise TaskFormatError with a short reason if it is poison."""
        try:
            if isinstance(body, bytes):
                if len(body) > MAX_BODY_BYTES:
                    raise TaskFormatError(f"body is {len(body)} bytes, more than {MAX_BODY_BYTES}")
                body = body.decode("utf-8")
            size = len(body.encode("utf-8", "surrogatepass"))
            if size > MAX_BODY_BYTES:
                raise TaskFormatError(f"body is {size} bytes, more than {MAX_BODY_BYTES}")
            data = json.loads(body)
        except TaskFormatError:
            raise
        except (UnicodeDecodeError, ValueError, RecursionError) as exc:
            raise TaskFormatError(f"body is not JSON text: {_short(exc)}") from None
        try:
            return cls._from_dict(data)
        except TaskFormatError:
            raise
        except (TypeError, ValueError, KeyError, AttributeError, RecursionError) as exc:
            raise TaskFormatError(f"malformed task: {_short(exc)}") from None

    @classmethod
    def _from_dict(cls, data: object) -> Task:
        if not isinstance(data, dict):
            raise TaskFormatError("body is not a JSON object")
        if "version" in data:
            if data["version"] not in (0, 1) or isinstance(data["version"], bool):
                raise TaskFormatError(f"unknown envelope version {data['version']!r}")
            raw_kwargs = data.get("kwargs")
            if isinstance(raw_kwargs, str):
                try:
                    kwargs = json.loads(raw_kwargs)
                except ValueError as exc:
                    raise TaskFormatError(f"kwargs is not JSON: {_short(exc)}") from None
            elif isinstance(raw_kwargs, dict):
                kwargs = raw_kwargs
            else:
                raise TaskFormatError("envelope has no kwargs object")
            if not isinstance(kwargs, dict):
                raise TaskFormatError("kwargs is not a JSON object")
            unknown = set(kwargs) - _KWARGS_KEYS
            if unknown:
                raise TaskFormatError(f"unknown kwargs keys: {', '.join(sorted(unknown))}")
            task_id = data.get("id") or new_task_id()
            num_retries = data.get("num_retries", 0)
            if "jobq_max_attempts" in data:
                max_attempts = data["jobq_max_attempts"]
            elif isinstance(num_retries, int) and not isinstance(num_retries, bool) \
                    and num_retries >= 0:
                # pushed by ai4s-jobq: it allows num_retries retries after the first run
                max_attempts = num_retries + 1
            else:
                max_attempts = None
            preemptions = data.get("jobq_preemptions", 0)
        else:
            kwargs = data
            task_id = data.get("id") or new_task_id()
            num_retries = 0
            max_attempts = data.get("max_attempts")
            preemptions = data.get("preemptions", 0)
        signature = data.get("jobq_sig")
        if "cmd" not in kwargs:
            raise TaskFormatError("task has no command (cmd)")
        env = kwargs.get("env")
        if env is None:
            env = {}
        if not isinstance(env, dict):
            raise TaskFormatError("env is not an object")
        # ai4s-jobq's worker turns numbers and booleans into strings; so do we.
        env = {k: str(v) if isinstance(v, (int, float, bool)) else v for k, v in env.items()}
        if not all(isinstance(v, str) for v in env.values()):
            raise TaskFormatError("env values must be strings")
        if not isinstance(num_retries, int) or isinstance(num_retries, bool):
            raise TaskFormatError("num_retries is not an integer")
        if not isinstance(preemptions, int) or isinstance(preemptions, bool) or preemptions < 0:
            raise TaskFormatError("preemption count is not a non-negative integer")
        return cls(
            cmd=kwargs["cmd"],
            id=str(task_id),
            env=dict(env),
            cwd=kwargs.get("cwd"),
            max_attempts=max_attempts,
            preemptions=preemptions,
            num_retries=num_retries,
            signature=signature,
            priority=data.get("jobq_priority", DEFAULT_PRIORITY),
            not_before=_number(data.get("jobq_not_before")),
            timeout=_number(data.get("jobq_timeout")),
            unique_key=data.get("jobq_unique_key"),
        )


def _os_encodable(text: str) -> bool:
    """Whether the OS can be given this string (argv, environment, path): os.fsencode works.

    JSON may carry lone surrogates (``"\\ud800"``); only U+DC80..U+DCFF map back to bytes."""
    try:
        os.fsencode(text)
    except UnicodeEncodeError:
        return False
    return True


def storable(text: str) -> str:
    """``text`` as every store can hold it: a lone UTF-16 surrogate (a byte of an OS string
    that is not UTF-8, e.g. the task's cwd in a spawn error) as its ``\\uXXXX`` escape.
    Raw, it fails the store's UTF-8 encoding, and a settlement that holds it fails on every
    retry."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def parse_or_body(body: str) -> Task | str:
    """The task, or the body itself when it is not one (for peek listings)."""
    try:
        return Task.parse(body)
    except TaskFormatError:
        return body


def _validate(cmd: object, env: object, cwd: object, max_attempts: object,
              task_id: object) -> None:
    if not isinstance(cmd, str) or not cmd.strip():
        raise TaskFormatError("command (cmd) must be a non-empty string")
    if "\x00" in cmd:
        raise TaskFormatError("command contains a NUL byte")
    if not _os_encodable(cmd):
        raise TaskFormatError("command contains characters no OS string can hold "
                              "(lone UTF-16 surrogates)")
    size = len(cmd.encode("utf-8", "surrogatepass"))
    if size > MAX_COMMAND_BYTES:
        raise TaskFormatError(f"command is {size} bytes, more than {MAX_COMMAND_BYTES}")
    if not isinstance(task_id, str) or id_problem(task_id):
        raise TaskFormatError(f"id must be a non-empty string of at most {MAX_ID} characters "
                              "without NUL or lone UTF-16 surrogates")
    if not isinstance(env, dict):
        raise TaskFormatError("env is not an object")
    for key, value in env.items():
        if not isinstance(key, str) or not key or "=" in key or "\x00" in key:
            raise TaskFormatError(f"bad environment variable name {key!r}")
        if not isinstance(value, str) or "\x00" in value:
            # the name escaped: a lone surrogate in it cannot be stored or logged as text
            shown = key.encode("utf-8", "backslashreplace").decode("utf-8")
            raise TaskFormatError(f"environment variable {shown} must be a string without NUL")
        if not _os_encodable(key) or not _os_encodable(value):
            raise TaskFormatError(f"environment variable {key!r} contains characters no OS "
                                  "string can hold (lone UTF-16 surrogates)")
    if cwd is not None and (not isinstance(cwd, str) or not cwd or "\x00" in cwd):
        raise TaskFormatError("cwd must be a non-empty string")
    if cwd is not None and not _os_encodable(cwd):
        raise TaskFormatError("cwd contains characters no OS string can hold "
                              "(lone UTF-16 surrogates)")
    if max_attempts is not None and (
        not isinstance(max_attempts, int) or isinstance(max_attempts, bool)
        or not 1 <= max_attempts <= MAX_ATTEMPTS
    ):
        raise TaskFormatError(f"max attempts must be an integer from 1 to {MAX_ATTEMPTS}")


def _number(value: V) -> V | float:
    """An integer where a float is meant reads as that float (others: _validate_schedule)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    return value


def _validate_schedule(priority: object, not_before: object, timeout: object,
                       unique_key: object) -> None:
    if not isinstance(priority, int) or isinstance(priority, bool) \
            or not 0 <= priority <= MAX_PRIORITY:
        raise TaskFormatError(f"priority must be an integer from 0 to {MAX_PRIORITY}")
    if not_before is not None and (not isinstance(not_before, float)
                                   or not 0 <= not_before < MAX_NOT_BEFORE):
        raise TaskFormatError("not-before must be epoch seconds")
    if timeout is not None and (not isinstance(timeout, float) or not 0 < timeout < 1e9):
        raise TaskFormatError("timeout must be a number of seconds above 0")
    if unique_key is not None and (not isinstance(unique_key, str) or not unique_key
                                   or len(unique_key) > MAX_UNIQUE_KEY
                                   or not unique_key.isprintable()):
        raise TaskFormatError(f"unique key must be 1..{MAX_UNIQUE_KEY} printable characters")


def _short(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text if len(text) <= 200 else text[:197] + "..."
