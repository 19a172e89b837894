"""Scheduling fields of the envelope (priority, not-before, timeout, unique key) and how
``jobq-ctl push`` turns its options into them (ctl.push_schedule); issue 18 items 2-6."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from types import SimpleNamespace
from typing import Any

import pytest

from supervisor.core.options import UsageError
from supervisor.core.task import Task, TaskFormatError
from supervisor.ctl.push_command import push_schedule
from supervisor.worker.launch import time_limit

pytestmark = pytest.mark.timeout(60)
NOW = 1_800_000_000.0


def test_fields_round_trip_at_the_top_level() -> None:
    task = Task(cmd="true", priority=8, not_before=NOW + 3, timeout=2.5, unique_key="k-1")
    body = json.loads(task.to_json())
    assert (body["jobq_priority"], body["jobq_not_before"], body["jobq_timeout"],
            body["jobq_unique_key"]) == (8, NOW + 3, 2.5, "k-1")
    assert json.loads(body["kwargs"]) == {"cmd": "true"}  # ai4s-jobq rejects unknown kwargs
    again = Task.parse(task.to_json())
    assert (again.priority, again.not_before, again.timeout, again.unique_key) == (
        8, NOW + 3, 2.5, "k-1")


def test_defaults_are_absent_and_absent_fields_read_as_defaults() -> None:
    body = json.loads(Task(cmd="true").to_json())
    assert not {k for k in body if k in ("jobq_priority", "jobq_not_before", "jobq_timeout",
                                         "jobq_unique_key")}
    # an older jobq-ctl's (or ai4s-jobq's) message
    old = Task.parse(json.dumps({"version": 1, "id": "x", "num_retries": 0,
                                 "kwargs": json.dumps({"cmd": "true"})}))
    assert (old.priority, old.not_before, old.timeout, old.unique_key) == (5, None, None, None)


def test_integer_seconds_read_as_floats() -> None:
    task = Task.parse(json.dumps({"cmd": "true", "jobq_timeout": 3, "jobq_not_before": 10}))
    assert (task.timeout, task.not_before) == (3.0, 10.0)


@pytest.mark.parametrize(("key", "value"), [
    ("jobq_priority", 10), ("jobq_priority", -1), ("jobq_priority", True),
    ("jobq_priority", "5"), ("jobq_timeout", 0), ("jobq_timeout", -2.0),
    ("jobq_timeout", "2s"), ("jobq_not_before", "tomorrow"), ("jobq_unique_key", ""),
    ("jobq_unique_key", "x" * 129), ("jobq_unique_key", 7), ("jobq_unique_key", "a\nb"),
])
def test_bad_scheduling_fields_are_poison(key: str, value: Any) -> None:
    with pytest.raises(TaskFormatError):
        Task.parse(json.dumps({"cmd": "true", key: value}))


# ------------------------------------------------------------------ jobq-ctl push options
def ns(**kw: Any) -> SimpleNamespace:
    base = {"priority": None, "delay": None, "not_before": None, "timeout": None,
            "unique_key": None, "unique": False}
    return SimpleNamespace(**{**base, **kw})


def backend(name: str = "sqlite", priorities: bool = True, max_delay: float | None = None,
            unique: bool = True, by_control: bool = False) -> Any:
    return SimpleNamespace(name=name, priorities=priorities, max_delay=max_delay,
                           unique_tasks=unique, unique_by_control=by_control)


def apply(args: SimpleNamespace, be: Any = None, n: int = 1, store: Any = None) -> list[Task]:
    tasks = [Task(cmd=f"echo {i}") for i in range(n)]
    return push_schedule(args, be or backend(), tasks, NOW, store)


def refusal(args: SimpleNamespace, be: Any = None, n: int = 1, store: Any = None) -> str:
    with pytest.raises(UsageError) as info:
        apply(args, be, n, store)
    text = str(info.value)
    assert "\n" not in text
    return text


def test_options_become_fields() -> None:
    [t] = apply(ns(priority=9, delay=3.0, timeout="2s", unique_key="nightly"))
    assert (t.priority, t.not_before, t.timeout, t.unique_key) == (9, NOW + 3, 2.0, "nightly")


def test_not_before_reads_iso_8601_with_or_without_zone() -> None:
    when = datetime(2030, 1, 2, 3, 4, 5, tzinfo=timezone.utc).timestamp()
    for text in ("2030-01-02T03:04:05Z", "2030-01-02T03:04:05+00:00", "2030-01-02T03:04:05",
                 "2030-01-02T04:04:05+01:00"):
        assert apply(ns(not_before=text))[0].not_before == when, text
    # a time already past: no delay at all
    assert apply(ns(not_before="2020-01-01T00:00:00Z"))[0].not_before is None


def test_unique_hashes_command_env_and_cwd_not_the_id() -> None:
    a, b = apply(ns(unique=True), n=2)
    again = push_schedule(ns(unique=True), backend(), [Task(cmd="echo 0")], NOW)[0]
    assert a.unique_key and b.unique_key and a.unique_key != b.unique_key
    assert again.unique_key == a.unique_key and again.id != a.id
    other_env = push_schedule(ns(unique=True), backend(), [Task(cmd="echo 0", env={"A": "1"})],
                              NOW)[0]
    assert other_env.unique_key != a.unique_key


@pytest.mark.parametrize(("args", "option"), [
    (ns(priority=10), "--priority"), (ns(priority=-1), "--priority"),
    (ns(not_before="next tuesday"), "--not-before"), (ns(timeout="0"), "--timeout"),
    (ns(timeout="0s"), "--timeout"), (ns(timeout="-3s"), "--timeout"),
    (ns(unique_key="k"), "--unique-key"),  # with two tasks (below)
    (ns(delay=1e12), "--delay"), (ns(not_before="9999-01-01T00:00:00Z"), "--not-before"),
])
def test_bad_input_is_one_line_naming_the_option(args: SimpleNamespace, option: str) -> None:
    assert refusal(args, n=2).startswith(option)


def test_backends_refuse_what_the_service_cannot_do() -> None:
    sq = backend("storage-queue", priorities=False, max_delay=7 * 86400, unique=False)
    text = refusal(ns(priority=5), sq)  # any explicit --priority, even the default
    assert text.startswith("--priority:") and "queue" in text
    assert refusal(ns(delay=7 * 86400 + 1.0), sq).startswith("--delay: storage-queue")
    assert refusal(ns(not_before="2099-01-01T00:00:00Z"), sq).startswith("--not-before:")
    assert apply(ns(delay=7 * 86400.0), sq)[0].not_before == NOW + 7 * 86400
    assert refusal(ns(unique=True), sq).startswith("--unique: storage-queue")
    assert refusal(ns(unique_key="k"), sq).startswith("--unique-key: storage-queue")


def test_unique_keys_through_the_control_store_need_one() -> None:
    sq = backend("storage-queue", priorities=False, unique=False, by_control=True)
    text = refusal(ns(unique_key="k"), sq)
    assert text.startswith("--unique-key: storage-queue") and "control store" in text
    assert refusal(ns(unique=True), sq).startswith("--unique: storage-queue")
    [task] = apply(ns(unique_key="k"), sq, store=object())
    assert task.unique_key == "k"


@pytest.mark.parametrize(("task", "worker", "applied"), [
    (None, None, None), (2.0, None, 2.0), (None, 30.0, 30.0), (2.0, 30.0, 2.0),
    (60.0, 30.0, 30.0), (5.0, 0.0, 5.0),
])
def test_the_smaller_limit_applies(task: float | None, worker: float | None,
                                   applied: float | None) -> None:
    assert time_limit(task, worker) == applied
