"""Issue 39 §3: a task's signature names its queue (core/signing.py), and the worker's check
(worker/task_guard.py) is given the queue the message was received from.  Signatures of an
older jobq-ctl (version 1, no queue) pass only with --accept-queue-unbound-signatures."""

from __future__ import annotations

import json

import pytest

from supervisor.core.settings import Settings
from supervisor.core.signing import (
    SecurityConfigError,
    SigningKey,
    canonical,
    key_id,
    mac,
    sign_task,
    verify,
)
from supervisor.core.task import Task
from supervisor.worker.main import parse_worker_settings
from supervisor.worker.task_guard import TaskGuard

pytestmark = pytest.mark.timeout(30)

NOW = 1_700_000_000.0  # the injected wall clock
KEY = SigningKey(kid=key_id(b"k" * 32), secret=b"k" * 32)
TAMPERED = "signature invalid: tampered (MAC mismatch)"
UNBOUND = ("signature invalid: not bound to a queue (an older jobq-ctl signed it; push it "
           "again, or see --accept-queue-unbound-signatures)")


def old_format(task: Task, iat: int = int(NOW)) -> Task:
    """The task as a jobq-ctl before issue 39 signed it: no "v", no queue."""
    return Task(**{**task.__dict__, "signature": {
        "kid": KEY.kid, "iat": iat, "mac": mac(KEY, canonical(task, iat, None))}})


def with_sig(task: Task, **changes: object) -> Task:
    assert isinstance(task.signature, dict)
    sig = {k: v for k, v in {**task.signature, **changes}.items() if v is not None}
    return Task(**{**task.__dict__, "signature": sig})


def test_a_signature_names_its_queue_and_verifies_there_only():
    signed = sign_task(Task(cmd="touch /tmp/x", id="t1"), KEY, NOW, queue="qb")
    body = json.loads(signed.to_json())["jobq_sig"]
    assert body["v"] == 2 and body["queue"] == "qb"
    received = Task.parse(signed.to_json())
    assert verify(received, [KEY], None, NOW, queue="qb") is None
    moved = "signature invalid: signed for queue 'qb', not 'qa'"
    assert verify(received, [KEY], None, NOW, queue="qa") == moved
    # the transition option is about old signatures only: a moved new one stays refused
    assert verify(received, [KEY], None, NOW, queue="qa", accept_unbound=True) == moved
    # the case matters: a SQLite or PostgreSQL queue name is case-sensitive
    assert verify(received, [KEY], None, NOW, queue="QB") is not None


def test_the_named_queue_cannot_be_rewritten_nor_stripped():
    signed = sign_task(Task(cmd="touch /tmp/x", id="t1"), KEY, NOW, queue="qb")
    assert verify(with_sig(signed, queue="qa"), [KEY], None, NOW, queue="qa") == TAMPERED
    # a new signature cut down to the old format: its MAC covered the queue
    downgraded = with_sig(signed, v=None, queue=None)
    for accept in (False, True):
        assert verify(downgraded, [KEY], None, NOW, queue="qa",
                      accept_unbound=accept) == TAMPERED


def test_old_format_signatures_need_the_transition_option():
    old = old_format(Task(cmd="echo hi", id="t1", priority=7))
    assert verify(old, [KEY], None, NOW, queue="qa") == UNBOUND
    assert verify(old, [KEY], None, NOW, queue="qa", accept_unbound=True) is None
    # still checked for everything else, expiry included
    forged = Task(cmd="rm -rf ~", id="t1", priority=7, signature=old.signature)
    assert verify(forged, [KEY], None, NOW, queue="qa", accept_unbound=True) == TAMPERED
    assert verify(old, [KEY], 60, NOW + 61, queue="qa",
                  accept_unbound=True).startswith("signature invalid: expired")
    # refused for its format only after the MAC: a forged old-format body says "tampered"
    assert verify(forged, [KEY], None, NOW, queue="qa") == TAMPERED


def test_versions_and_shapes():
    signed = sign_task(Task(cmd="echo hi", id="t1"), KEY, NOW, queue="qa")
    for bad, shown in ((3, "'3'"), (True, "'True'"), ("2", "'2'")):
        assert verify(with_sig(signed, v=bad), [KEY], None, NOW, queue="qa") == \
            f"signature invalid: unknown jobq_sig version {shown}"
    for queue in (None, 7, ["qa"]):
        no_queue = {k: v for k, v in signed.signature.items() if k != "queue"}
        if queue is not None:
            no_queue["queue"] = queue
        task = Task(cmd="echo hi", id="t1", signature=no_queue)
        assert verify(task, [KEY], None, NOW, queue="qa") == \
            "signature invalid: malformed jobq_sig"


def test_a_queue_name_in_a_reason_is_escaped():
    hostile = "qb\n2024 INFO fake line\x1b[2J\u202e"
    signed = sign_task(Task(cmd="echo hi", id="t1"), KEY, NOW, queue=hostile)
    reason = verify(signed, [KEY], None, NOW, queue="qa")
    assert reason is not None and reason.isprintable() and "\\n" in reason
    assert "\\x1b" in reason and "\\u202e" in reason


# ------------------------------------------------------------------------------- guard
def guard(tmp_path, **kw) -> TaskGuard:
    (tmp_path / "k").write_bytes(KEY.secret)
    return TaskGuard.from_settings(Settings(signing_key_file=[str(tmp_path / "k")], **kw),
                                   euid=1000)


def test_the_guard_checks_the_queue_it_is_given(tmp_path):
    g = guard(tmp_path)
    signed = sign_task(Task(cmd="true"), KEY, NOW, queue="qb")
    assert g.refusal(signed, NOW, queue="qb") is None
    assert g.refusal(signed, NOW, queue="qa") == \
        "signature invalid: signed for queue 'qb', not 'qa'"
    assert g.refusal(old_format(Task(cmd="true")), NOW, queue="qa") == UNBOUND
    assert not any("unbound" in w for w in g.warnings), "off by default, and quiet"


def test_the_transition_option_warns_and_needs_keys(tmp_path):
    g = guard(tmp_path, accept_queue_unbound_signatures=True)
    assert g.refusal(old_format(Task(cmd="true")), NOW, queue="qa") is None
    [warning] = [w for w in g.warnings if w.startswith("--accept-queue-unbound-signatures")]
    assert "run on any queue that trusts their key" in warning
    with pytest.raises(SecurityConfigError,
                       match="^--accept-queue-unbound-signatures: needs --signing-key-file$"):
        TaskGuard.from_settings(Settings(accept_queue_unbound_signatures=True), euid=1000)


def test_the_option_is_a_worker_flag():
    assert parse_worker_settings(["--sqlite-path", "/tmp/x.db",
                                  "--accept-queue-unbound-signatures"]
                                 ).accept_queue_unbound_signatures is True
    assert parse_worker_settings(["--sqlite-path", "/tmp/x.db"]
                                 ).accept_queue_unbound_signatures is False
