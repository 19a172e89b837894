"""Issue 39 §3 replayed: a task signed for one queue, moved into another that trusts the same
key, must not run there.

Real commands on a real SQLite file holding two queues: ``jobq-ctl push --queue qb
--signing-key-file K``, the row moved into ``qa`` (what anyone with write access to the file
can do), a worker on ``qa`` with the key.  Each task's command would create a marker file: a
refused task's marker never exists.
"""

from __future__ import annotations

import os
import sqlite3
import time
from pathlib import Path

import pytest

from supervisor.core.settings import EXIT_TASKS_FAILED
from supervisor.core.signing import canonical, load_key, mac
from supervisor.core.task import Task
from supervisor.fleet.control import Cancel, Command, QueueFlag, new_seq
from supervisor.fleet.control.base import queue_partition
from supervisor.fleet.control.signing import Gate, sign
from supervisor.fleet.control.sqlite import SqliteControlStore
from supervisor.fleet.directives import Directives

pytestmark = pytest.mark.timeout(90)

MOVED = "signature invalid: signed for queue 'qb', not 'qa'"


def make_key(path: Path) -> Path:
    path.write_text(os.urandom(32).hex() + "\n")
    path.chmod(0o600)
    return path


def write_row(env, task_id: str, sql: str, *args: object) -> None:
    """An attacker's UPDATE of a pending job's row."""
    conn = sqlite3.connect(env.db, timeout=30)
    try:
        with conn:
            assert conn.execute(sql, (*args, task_id)).rowcount == 1
    finally:
        conn.close()


def push(env, queue: str, key: Path, cmd: str) -> str:
    [task_id] = env.push(cmd, extra=("--queue", queue, "--signing-key-file", str(key)))
    return task_id


def test_a_task_signed_for_qb_and_moved_into_qa_is_dead_lettered_unrun(env):
    key = make_key(env.tmp / "k")
    env.serve("qa")
    env.serve("qb")
    moved = push(env, "qb", key, f"touch {env.tmp}/ran-moved")
    honest = push(env, "qa", key, f"touch {env.tmp}/ran-honest")
    write_row(env, moved, "UPDATE jobs SET queue=? WHERE id=?", "qa")
    sup = env.supervisor("--queue", "qa", "--exit-when-empty", "--signing-key-file", str(key))
    assert sup.wait(60) == EXIT_TASKS_FAILED, sup.log()
    assert not (env.tmp / "ran-moved").exists()
    assert (env.tmp / "ran-honest").exists(), "a task signed for qa runs on qa"
    job = env.job(moved)
    assert (job["queue"], job["status"], job["reason"]) == ("qa", "failed", MOVED)
    assert env.job(honest)["status"] == "succeeded"
    assert f"{MOVED}; dead-lettering it without a run" in sup.log()


def test_each_queue_of_a_multi_queue_worker_checks_its_own_name(env):
    """``--queue qa,qb``: every lease is checked against the queue it came from, not the
    worker's first one, nor any of its queues."""
    key = make_key(env.tmp / "k")
    moved = push(env, "qb", key, f"touch {env.tmp}/ran-moved")
    in_qb = push(env, "qb", key, f"touch {env.tmp}/ran-qb")
    in_qa = push(env, "qa", key, f"touch {env.tmp}/ran-qa")
    write_row(env, moved, "UPDATE jobs SET queue=? WHERE id=?", "qa")
    sup = env.supervisor("--queue", "qa,qb", "--exit-when-empty",
                         "--signing-key-file", str(key))
    assert sup.wait(60) == EXIT_TASKS_FAILED, sup.log()
    assert not (env.tmp / "ran-moved").exists()
    assert (env.tmp / "ran-qa").exists() and (env.tmp / "ran-qb").exists()
    assert env.job(moved)["reason"] == MOVED
    assert env.job(in_qa)["status"] == env.job(in_qb)["status"] == "succeeded"


def test_old_format_signatures_run_only_inside_the_upgrade_window(env):
    """A signature of an older jobq-ctl names no queue: refused by default (it could have
    been moved), run with --accept-queue-unbound-signatures, which warns at start."""
    key = make_key(env.tmp / "k")
    secret = load_key(str(key))
    ids = []
    for name in ("refused", "accepted"):
        task_id = push(env, "qa", key, f"touch {env.tmp}/ran-{name}")
        task = Task(cmd=f"touch {env.tmp}/ran-{name}", id=task_id)
        iat = int(time.time())
        old = Task(cmd=task.cmd, id=task_id, signature={
            "kid": secret.kid, "iat": iat, "mac": mac(secret, canonical(task, iat, None))})
        write_row(env, task_id, "UPDATE jobs SET body=? WHERE id=?", old.to_json())
        ids.append(task_id)
        sign = ("--queue", "qa", "--exit-when-empty", "--signing-key-file", str(key))
        if name == "refused":
            sup = env.supervisor(*sign)
            assert sup.wait(60) == EXIT_TASKS_FAILED, sup.log()
            assert "tasks signed without a queue" not in sup.log()
        else:
            sup = env.supervisor(*sign, "--accept-queue-unbound-signatures")
            assert sup.wait(60) == 0, sup.log()
            assert "--accept-queue-unbound-signatures: tasks signed without a queue" \
                in sup.log()
    refused, accepted = ids
    assert not (env.tmp / "ran-refused").exists()
    assert env.job(refused)["reason"].startswith("signature invalid: not bound to a queue")
    assert (env.tmp / "ran-accepted").exists()
    assert env.job(accepted)["status"] == "succeeded"


def test_signed_control_records_moved_to_another_queue_are_not_acted_on(tmp_path):
    """The same replay for control records: a cancel, a pause flag and a drain command signed
    for ``qb``, moved into ``qa``'s records, are ignored by a worker on ``qa`` -- their
    signature covers the queue they name (fleet/control/signing.py), and a worker acts only
    on records naming its own queue."""
    key = load_key(str(make_key(tmp_path / "k")))
    store = SqliteControlStore(str(tmp_path / "q.db"))
    handed: list[object] = []
    woken: list[int] = []
    when = 1e9
    directives = Directives(queue_name="qa", worker_id="w1", started_wall=when - 10,
                            gate=Gate([key]), on_paused=handed.append,
                            on_command=handed.append, wake_watchdog=lambda: woken.append(1),
                            tasks=lambda: (), clock=lambda: 0.0, wall=lambda: when)
    try:
        for queue in ("qb", "qa"):
            store.put_cancel(sign(Cancel(queue=queue, task_id="t1", reason="r", who="ops",
                                         when=when), key))
            store.put_flag(sign(QueueFlag(queue=queue, paused=True, who="ops", when=when),
                                key))
            store.put_command(sign(Command(queue=queue, worker="w1", seq=new_seq(when),
                                           action="drain", who="ops", when=when), key))
            if queue == "qb":  # the attacker's move: the records' partition, not their text
                conn = sqlite3.connect(tmp_path / "q.db", timeout=30)
                with conn:
                    assert conn.execute("UPDATE control_records SET part=? WHERE part=?",
                                        (queue_partition("qa"), queue_partition("qb"))
                                        ).rowcount == 3
                conn.close()
                directives.poll(store)
                assert (directives.cancels, directives.paused, handed) == ({}, False, [])
        # the same records signed for qa are acted on: the worker does read this place
        directives.cursor = None
        directives.poll(store)
        assert set(directives.cancels) == {"t1"} and directives.paused
        assert [type(h).__name__ for h in handed] == ["bool", "Command"]
    finally:
        store.close()
