"""Records, keys and signatures without a store."""

from __future__ import annotations

import json

import pytest

from supervisor.core import signing
from supervisor.core.signing import SigningKey, key_id
from supervisor.core.task import Task
from supervisor.fleet.control import Cancel, Command, QueueFlag, TaskInfo, WorkerRecord, new_seq
from supervisor.fleet.control.base import (
    OnceLog,
    after_prefix,
    cancel_key,
    command_prefix,
    key_part,
)
from supervisor.fleet.control.records import (
    SHORT_CMD_CHARS,
    WORKER_DOC_BYTES,
    RecordError,
    chunks,
    decode,
    encode,
    stored_bytes,
)
from supervisor.fleet.control.signing import canonical as record_text
from supervisor.fleet.control.signing import sign, verify
from supervisor.fleet.storage_account import service_url

NOW = 1_700_000_000.0
KEY = SigningKey(kid=key_id(b"a" * 32), secret=b"a" * 32)
OTHER = SigningKey(kid=key_id(b"b" * 32), secret=b"b" * 32)


def _worker(n: int, cmd: str, env_names: tuple[str, ...] = ()) -> WorkerRecord:
    tasks = tuple(TaskInfo(id=f"{i:08d}-aaaa-bbbb-cccc-dddddddddddd", attempt=2, pid=10_000 + i,
                           started=NOW, lease_expires=None, cmd=cmd, env_names=env_names)
                  for i in range(n))
    return WorkerRecord(id="h:1", queue="q", host="h", pid=1, version="0.1.0", state="paused",
                        slots_used=n, slots_total=n, started=NOW, heartbeat=NOW, tasks=tasks)


def test_round_trip_every_kind() -> None:
    records = [
        _worker(2, "echo ünïcode"),
        Cancel(queue="q", task_id="t", reason="r", who="w", when=NOW, grace=0.0),
        QueueFlag(queue="q", paused=True, who="w", when=NOW),
        Command(queue="q", worker="h:1", seq=new_seq(NOW), action="stop", who="w", when=NOW),
    ]
    for record in records:
        assert decode(encode(record)) == record


def test_worker_record_schema_has_no_secrets() -> None:
    doc = json.loads(encode(_worker(1, "x")))
    assert set(doc) == {"v", "kind", "id", "queue", "host", "pid", "version", "state",
                        "slots_used", "slots_total", "started", "heartbeat", "interval",
                        "tasks", "tasks_omitted", "succeeded", "failed"}
    assert set(doc["tasks"][0]) == {"id", "attempt", "pid", "started", "lease_expires", "cmd",
                                    "env_names"}


def test_a_running_tasks_environment_names_travel_and_never_a_value() -> None:
    """Issue 26: the dashboard shows a running task's environment names (values masked);
    a task of a worker from before has none."""
    record = _worker(1, "x", ("API_TOKEN", "MODE"))
    text = encode(record)
    assert decode(text) == record
    assert json.loads(text)["tasks"][0]["env_names"] == ["API_TOKEN", "MODE"]
    old = json.loads(text)
    del old["tasks"][0]["env_names"]
    back = decode(json.dumps(old))
    assert isinstance(back, WorkerRecord) and back.tasks[0].env_names == ()
    old["tasks"][0]["env_names"] = "API_TOKEN"
    with pytest.raises(RecordError):
        decode(json.dumps(old))


@pytest.mark.parametrize("cmd", ["a" * 300, "é" * 300, "😀" * 300])
def test_thousand_tasks_always_fit(cmd: str) -> None:
    text = encode(_worker(1000, cmd))
    back = decode(text)
    assert isinstance(back, WorkerRecord)
    assert len(back.tasks) == 1000 and back.tasks_omitted == 0
    assert stored_bytes(text) <= WORKER_DOC_BYTES
    assert all(len(c) <= 15_000 for c in chunks(text))


def test_commands_are_shortened_before_tasks_are_dropped() -> None:
    back = decode(encode(_worker(2000, "é" * 300, tuple(f"NAME_{i}" for i in range(20)))))
    assert isinstance(back, WorkerRecord)
    assert len(back.tasks) == 2000 - back.tasks_omitted > 1500
    assert len(back.tasks[0].cmd) == SHORT_CMD_CHARS
    assert back.tasks[0].env_names == (), "environment names go with the long commands"
    assert decode(encode(_worker(2, "x", ("A",)))).tasks[0].env_names == ("A",)  # type: ignore


@pytest.mark.parametrize("text, why", [
    ("{", "bad JSON"),
    ("[]", "not a JSON object"),
    ('{"v": 2, "kind": "flag"}', "unknown version"),
    ('{"v": 1, "kind": "nope"}', "unexpected kind"),
    ('{"v": 1, "kind": "flag", "queue": "q", "paused": 1, "who": "w", "when": 1}', "paused"),
    ('{"v": 1, "kind": "flag", "queue": "q", "paused": true, "who": "w"}', "missing"),
    ('{"v": 1, "kind": "cancel", "queue": "q", "task_id": "t", "reason": "r", "who": "w", '
     '"when": 1, "grace": -1}', "negative grace"),
    ('{"v": 1, "kind": "cmd", "queue": "q", "worker": "w", "seq": "1", "action": "rm -rf /", '
     '"who": "w", "when": 1}', "unknown action"),
    ('{"v": 1, "kind": "flag", "queue": "q", "paused": true, "who": "w", "when": 1, '
     '"sig": "x"}', "sig"),
])
def test_bad_documents_are_refused(text: str, why: str) -> None:
    with pytest.raises(RecordError, match=why):
        decode(text)


def test_kind_must_match_its_key() -> None:
    text = encode(QueueFlag(queue="q", paused=True, who="w", when=NOW))
    with pytest.raises(RecordError, match="unexpected kind"):
        decode(text, "cancel")


def test_extra_fields_are_ignored() -> None:
    doc = json.loads(encode(QueueFlag(queue="q", paused=False, who="w", when=NOW)))
    doc["future"] = [1, 2]
    assert decode(json.dumps(doc)) == QueueFlag(queue="q", paused=False, who="w", when=NOW)


def test_keys_cannot_reach_into_each_other() -> None:
    assert key_part("a:b/c#d?e\\f%") == "a%3Ab%2Fc%23d%3Fe%5Cf%25"
    assert key_part("a%3Ab") != key_part("a:b")
    worker_h, worker_h1 = command_prefix("h"), command_prefix("h:1")
    assert not worker_h1.startswith(worker_h)
    assert worker_h < worker_h + "x" < after_prefix(worker_h)
    assert cancel_key("\x00\x7f") == "cancel:%00%7F"


def test_table_endpoint_from_queue_url() -> None:
    assert (service_url("https://acct.queue.core.windows.net/", "table")
            == "https://acct.table.core.windows.net")
    assert (service_url("https://acct.queue.core.windows.net:8443?sv=1&sig=x", "table")
            == "https://acct.table.core.windows.net:8443?sv=1&sig=x")
    # another cloud's host: open_control_store never derived one (its store was off)
    assert service_url("https://acct.queue.core.chinacloudapi.cn?sv=1&sig=x", "table") is None


def test_signatures_bind_every_field() -> None:
    cancel = sign(Cancel(queue="q", task_id="t", reason="r", who="w", when=NOW), KEY)
    assert cancel.sig is not None and cancel.sig["kid"] == KEY.kid
    assert verify(decode(encode(cancel)), [OTHER, KEY]) is None  # survives a round trip
    assert verify(cancel, [OTHER]) == f"unknown key id {KEY.kid!r}"
    for change in ({"task_id": "u"}, {"queue": "p"}, {"when": NOW + 1}, {"grace": 9.0}):
        moved = Cancel(**{**cancel.__dict__, **change})
        assert verify(moved, [KEY]) == "tampered (MAC mismatch)"
    flag = sign(QueueFlag(queue="q", paused=True, who="w", when=NOW), KEY)
    assert verify(QueueFlag(**{**flag.__dict__, "paused": False}), [KEY]) is not None
    assert verify(Cancel(**{**cancel.__dict__, "sig": {"kid": KEY.kid, "mac": "é"}}),
                  [KEY]) == "tampered (MAC mismatch)"


def test_records_and_tasks_share_one_mac() -> None:
    """One HMAC core (core/signing.py) signs both: a record and a task differ only in the
    canonical text the MAC covers, and both accept the MAC in upper case."""
    cancel = sign(Cancel(queue="q", task_id="t", reason="r", who="w", when=NOW), KEY)
    assert cancel.sig is not None
    assert cancel.sig["mac"] == signing.mac(KEY, record_text(cancel))
    task = signing.sign_task(Task(cmd="echo hi", id="t"), KEY, NOW, queue="q")
    assert task.signature["mac"] == signing.mac(KEY, signing.canonical(task, int(NOW), "q"))
    upper = Cancel(**{**cancel.__dict__, "sig": {**cancel.sig, "mac": cancel.sig["mac"].upper()}})
    assert verify(upper, [KEY]) is None
    task_upper = Task(**{**task.__dict__, "signature": {
        **task.signature, "mac": task.signature["mac"].upper()}})
    assert signing.verify(task_upper, [KEY], None, NOW, queue="q") is None


def test_once_log_is_bounded(caplog: pytest.LogCaptureFixture) -> None:
    once = OnceLog(limit=2)
    assert once.warn("a", "x") and not once.warn("a", "x")
    assert once.warn("b", "x") and once.warn("c", "x")  # the set was full and restarted
    assert len(once._seen) == 1


def test_new_seq_sorts_by_time() -> None:
    assert new_seq(NOW) < new_seq(NOW + 0.001) and new_seq(NOW) != new_seq(NOW)
