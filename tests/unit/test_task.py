"""Task: round trip, the ai4s-jobq v1 envelope, our own format, and poison bodies."""

from __future__ import annotations

import json
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from supervisor.core.task import MAX_BODY_BYTES, Task, TaskFormatError

pytestmark = pytest.mark.timeout(60)


def envelope(kwargs, **top) -> str:
    body = {"version": 1, "reply_requested": False, "num_retries": 0, "id": "abc",
            "kwargs": kwargs if isinstance(kwargs, str) else json.dumps(kwargs)}
    body.update(top)
    return json.dumps(body)


# --------------------------------------------------------------------------- round trip
@pytest.mark.parametrize(
    "task",
    [
        Task(cmd="echo hi"),
        Task(cmd="echo $A && pwd", id="t-1", env={"A": "1", "B": ""}, cwd="/tmp",
             max_attempts=3, preemptions=2, num_retries=4),
        Task(cmd="printf '%s\\n' \"ünïcödé ☃\"", env={"X": "\"quoted\" \\ back"}),
    ],
)
def test_round_trip(task: Task) -> None:
    text = task.to_json()
    assert isinstance(text, str)
    again = Task.parse(text)
    assert again == task
    assert Task.parse(text.encode("utf-8")) == task


def test_envelope_keys() -> None:
    task = Task(cmd="echo hi", id="t-42", env={"A": "1"}, cwd="/srv", max_attempts=2)
    body = json.loads(task.to_json())
    assert body["version"] == 1
    assert body["id"] == "t-42"
    assert body["num_retries"] == 1  # ai4s-jobq: retries left after the first run
    assert body["reply_requested"] is False
    assert isinstance(body["kwargs"], str)
    kwargs = json.loads(body["kwargs"])
    assert kwargs == {"cmd": "echo hi", "env": {"A": "1"}, "cwd": "/srv"}
    # our own fields live at the top level, never inside kwargs
    assert body["jobq_max_attempts"] == 2


def test_envelope_kwargs_hold_only_cmd_when_no_env_or_cwd() -> None:
    body = json.loads(Task(cmd="true").to_json())
    assert set(body) >= {"version", "id", "num_retries", "reply_requested", "kwargs"}
    assert json.loads(body["kwargs"]) == {"cmd": "true"}


def test_generated_ids_are_unique_hex() -> None:
    a, b = Task(cmd="true"), Task(cmd="true")
    assert a.id != b.id
    int(a.id, 16)


def test_own_format_accepted() -> None:
    task = Task.parse('{"cmd": "echo hi"}')
    assert task.cmd == "echo hi"
    assert task.env == {}
    assert task.cwd is None
    assert task.max_attempts is None
    assert task.id

    task = Task.parse(json.dumps({"cmd": "ls", "env": {"A": "b"}, "cwd": "/x", "id": "mine",
                                  "max_attempts": 4}))
    assert (task.cmd, task.env, task.cwd, task.id, task.max_attempts) == (
        "ls", {"A": "b"}, "/x", "mine", 4)


def test_envelope_from_ai4s_jobq_accepted() -> None:
    task = Task.parse(envelope({"cmd": "python train.py", "env": {"SEED": "1"},
                                "bg_dirsync_to": None}, num_retries=2))
    assert task.cmd == "python train.py"
    assert task.env == {"SEED": "1"}
    assert task.id == "abc"
    assert task.num_retries == 2


def test_with_preemption_survives_the_round_trip() -> None:
    task = Task(cmd="true").with_preemption().with_preemption()
    assert Task.parse(task.to_json()).preemptions == 2


# --------------------------------------------------------------------------- poison
BIG = "x" * (MAX_BODY_BYTES + 1)
NESTED = "[" * 30000 + "]" * 30000  # under the size limit, far over the recursion limit

POISON = {
    "non-utf8 bytes": b'{"cmd": "echo \xff\xfe"}',
    "latin-1 bytes": '{"cmd": "caf\u00e9"}'.encode("latin-1"),
    "not json": "echo hi",
    "empty": "",
    "truncated json": '{"cmd": "echo',
    "json array": '["echo", "hi"]',
    "json string": '"echo hi"',
    "json number": "42",
    "json null": "null",
    "no cmd": '{"env": {}}',
    "envelope without cmd": envelope({"env": {"A": "1"}}),
    "empty cmd": '{"cmd": ""}',
    "blank cmd": '{"cmd": "   "}',
    "cmd not a string": '{"cmd": ["ls", "-l"]}',
    "cmd with NUL": '{"cmd": "echo \\u0000"}',
    "cmd with a lone surrogate": '{"cmd": "echo \\ud800"}',
    "env value with a lone surrogate": '{"cmd": "true", "env": {"A": "\\udbff"}}',
    "env name with a lone surrogate": '{"cmd": "true", "env": {"\\ud800": "1"}}',
    "cwd with a lone surrogate": '{"cmd": "true", "cwd": "/tmp/\\udfff"}',
    "cmd too long": json.dumps({"cmd": "x" * (33 * 1024)}),
    "version 2": envelope({"cmd": "true"}, version=2),
    "version true": envelope({"cmd": "true"}, version=True),
    "version string": envelope({"cmd": "true"}, version="1"),
    "env not object": '{"cmd": "true", "env": "A=1"}',
    "env a non-empty list": '{"cmd": "true", "env": ["A=1"]}',
    "env value not string": '{"cmd": "true", "env": {"A": [1]}}',
    "env value null": '{"cmd": "true", "env": {"A": null}}',
    "env name with =": '{"cmd": "true", "env": {"A=B": "1"}}',
    "env name empty": '{"cmd": "true", "env": {"": "1"}}',
    "envelope env value not string": envelope({"cmd": "true", "env": {"N": None}}),
    "unknown kwargs key": envelope({"cmd": "true", "timeout": 5}),
    "kwargs not json": envelope("{cmd: true}"),
    "kwargs a json list": envelope('["true"]'),
    "kwargs missing": json.dumps({"version": 1, "id": "x"}),
    "kwargs a number": json.dumps({"version": 1, "kwargs": 5}),
    "cwd empty": '{"cmd": "true", "cwd": ""}',
    "cwd not string": '{"cmd": "true", "cwd": 5}',
    "max attempts zero": '{"cmd": "true", "max_attempts": 0}',
    "max attempts absurd": '{"cmd": "true", "max_attempts": 8156311673}',
    "max attempts string": envelope({"cmd": "true"}, jobq_max_attempts="3"),
    "negative preemptions": envelope({"cmd": "true"}, jobq_preemptions=-1),
    "num_retries not int": envelope({"cmd": "true"}, num_retries="0"),
    "id too long": json.dumps({"cmd": "true", "id": "i" * 129}),
    # found by the SQLite fuzz test: the id names the output and result records, which no
    # store could write; the result outbox failed on every retry
    "envelope id with a lone surrogate": json.dumps({"version": 1, "id": "a\udcffb",
                                                     "kwargs": json.dumps({"cmd": "true"})}),
    "id with a lone surrogate": json.dumps({"cmd": "true", "id": "\ud800"}),
    "id with NUL": json.dumps({"cmd": "true", "id": "a\x00"}),
    "too large str body": json.dumps({"cmd": "true", "pad": BIG}),
    "too large bytes body": json.dumps({"cmd": "true", "pad": BIG}).encode(),
    "deeply nested json": NESTED,
    "deeply nested object": '{"cmd": "true", "x": ' + '{"a":' * 10000 + "1" + "}" * 10001,
    "deeply nested kwargs": envelope("[" * 20000 + "]" * 20000),
}


@pytest.mark.parametrize("body", list(POISON.values()), ids=list(POISON))
def test_poison_raises_task_format_error(body) -> None:
    with pytest.raises(TaskFormatError) as info:
        Task.parse(body)
    assert type(info.value) is TaskFormatError
    assert str(info.value)  # a short reason for the dead-letter record
    assert len(str(info.value)) < 1000


@pytest.mark.parametrize("body", [NESTED, POISON["deeply nested object"]])
def test_deep_nesting_is_rejected_under_the_size_limit(body: str) -> None:
    # these must reach the JSON decoder (not be cut short by the size check)
    assert len(body) <= MAX_BODY_BYTES
    with pytest.raises(TaskFormatError, match="not JSON"):
        Task.parse(body)


@pytest.mark.parametrize("env", ["[]", '""', "0", "false"])
def test_falsy_env_that_is_not_an_object_is_poison(env: str) -> None:
    with pytest.raises(TaskFormatError):
        Task.parse('{"cmd": "true", "env": ' + env + "}")


def test_oversized_task_cannot_be_serialized() -> None:
    task = Task(cmd="true", env={"PAD": "x" * MAX_BODY_BYTES})
    with pytest.raises(TaskFormatError):
        task.to_json()


def test_constructor_validates() -> None:
    with pytest.raises(TaskFormatError):
        Task(cmd="")
    with pytest.raises(TaskFormatError):
        Task(cmd="true", env={"A": 1})  # type: ignore[dict-item]
    with pytest.raises(TaskFormatError):
        Task(cmd="true", max_attempts=True)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- fuzzing
def _check(body) -> None:
    try:
        task = Task.parse(body)
    except TaskFormatError:
        return
    assert isinstance(task, Task)
    assert isinstance(task.cmd, str) and task.cmd.strip()
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in task.env.items())


@settings(database=None, max_examples=300, deadline=None)
@given(st.text(max_size=300))
def test_parse_arbitrary_text(body: str) -> None:
    _check(body)


@settings(database=None, max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_parse_arbitrary_bytes(body: bytes) -> None:
    _check(body)


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner,
                                                                max_size=3),
    max_leaves=10,
)
KEYS = st.sampled_from(["cmd", "env", "cwd", "id", "max_attempts", "preemptions", "version",
                        "kwargs", "num_retries", "jobq_max_attempts", "jobq_preemptions",
                        "bg_dirsync_to", "other"])
OBJECTS = st.dictionaries(KEYS, JSON | st.just("echo hi") | st.just({"A": "1"}), max_size=6)


@settings(database=None, max_examples=500, deadline=None)
@given(OBJECTS, st.booleans(), st.dictionaries(KEYS, JSON, max_size=4))
def test_parse_arbitrary_json_objects(obj: dict, as_envelope: bool, top: dict) -> None:
    if as_envelope:
        top = dict(top)
        top.update(version=1, kwargs=json.dumps(obj))
        body = json.dumps(top)
    else:
        body = json.dumps(obj)
    _check(body)
    _check(body.encode("utf-8", "surrogatepass"))


def test_ai4s_compat_num_retries_and_scalar_env() -> None:
    """A message pushed by ai4s-jobq: num_retries retries allowed, scalars in env coerced."""
    foreign = json.dumps({"version": 1, "reply_requested": False, "num_retries": 2, "id": "x",
                          "kwargs": json.dumps({"cmd": "true", "env": {"N": 3, "F": True}})})
    task = Task.parse(foreign)
    assert task.max_attempts == 3
    assert task.env == {"N": "3", "F": "True"}
    # ours: the worker default stays the worker's when no --max-attempts was given
    assert Task.parse(Task(cmd="true").to_json()).max_attempts is None
    assert json.loads(Task(cmd="true", max_attempts=4).to_json())["num_retries"] == 3


def test_escaped_bytes_round_trip_to_the_os() -> None:
    """U+DC80..U+DCFF are how Python carries bytes that are not UTF-8 (argv of jobq-ctl push):
    they survive the JSON and reach the OS as the original bytes."""
    task = Task(cmd="echo caf\udce9", env={"A": "\udcff"}, cwd="/tmp/\udc80")
    parsed = Task.parse(task.to_json())
    assert os.fsencode(parsed.cmd) == b"echo caf\xe9"
    assert os.fsencode(parsed.env["A"]) == b"\xff" and os.fsencode(parsed.cwd) == b"/tmp/\x80"


def test_task_id_shapes():
    """Issue 26 (5): what jobq-ctl refuses as a task id (ctl_guards.py)."""
    import hashlib
    import uuid

    from supervisor.core.task import MAX_ID, Task, id_problem, is_made_id

    for made in (Task(cmd="true").id, uuid.uuid4().hex, hashlib.md5(b"x").hexdigest(),
                 str(uuid.uuid4()), str(uuid.uuid4()).upper()):
        assert is_made_id(made) and id_problem(made) is None
    for other in ("nope", "job-17", "a" * 31, "a" * 33, "g" * 32, ""):
        assert not is_made_id(other)
    assert id_problem("job-17") is None  # a hand-written body may carry it
    assert id_problem("") and id_problem("x" * (MAX_ID + 1))
    assert id_problem("x" * MAX_ID) is None
    assert id_problem("a\udcffb") and id_problem("a\x00")


def test_a_refusal_naming_an_env_name_with_a_lone_surrogate_is_storable_text() -> None:
    # Found by the SQLite fuzz test: the reason quoted the name raw, SQLite could not store it,
    # and the dead-letter write failed for ever. The reason must encode as UTF-8.
    body = json.dumps({"cmd": "true", "env": {"\udc85": "a\x00b"}})
    with pytest.raises(TaskFormatError) as err:
        Task.parse(body)
    str(err.value).encode("utf-8")
    assert "\\udc85" in str(err.value)
