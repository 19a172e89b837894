"""Succeeded tasks do not stay in the SQLite queue for ever (issue 25, class 7): a real worker
purges those older than --retention on its maintenance pass, ``jobq-ctl prune`` at once;
failed and cancelled tasks stay.  Age comes from rewriting the rows' ``updated_at`` in the
file (the time a task ended), never from sleeping."""

from __future__ import annotations

import os
import sqlite3
import time

import pytest

from supervisor.worker.task_logs import log_name
from tests.integration.helpers import one_usage_line

pytestmark = pytest.mark.timeout(90)

DAY = 86_400


def age(env, days: float) -> None:
    """Every task in the file ended ``days`` earlier than it did."""
    conn = sqlite3.connect(env.db, timeout=30, isolation_level=None)
    try:
        conn.execute("UPDATE jobs SET updated_at=updated_at-?", (days * DAY,))
    finally:
        conn.close()


def statuses(env) -> dict[str, str]:
    return dict(env.rows("SELECT id, status FROM jobs"))


def first_week(env) -> tuple[list[str], str, str]:
    """Three succeeded tasks, one failed, one cancelled before it ran (all in the failed
    state but the three); their ids."""
    ok = env.push("true", "true", "true")
    [bad] = env.push("exit 1", extra=("--max-attempts", "1"))
    [dropped] = env.push("sleep 100")
    env.ctl("cancel", dropped, "--reason", "not needed")
    sup = env.supervisor("--exit-when-empty", name="first")
    assert sup.wait(60) == 4
    assert [statuses(env)[i] for i in (*ok, bad, dropped)] == ["succeeded"] * 3 + ["failed"] * 2
    return ok, bad, dropped


def test_the_worker_purges_succeeded_tasks_past_the_retention(env):
    ok, bad, dropped = first_week(env)
    age(env, 8)  # a week and a day later
    [fresh] = env.push("true")
    sup = env.supervisor("--exit-when-empty", name="later")
    assert sup.wait(60) == 0
    assert statuses(env) == {bad: "failed", dropped: "failed", fresh: "succeeded"}
    assert "purged 3 succeeded task(s) older than 7d" in sup.log()
    assert env.job(dropped)["reason"].startswith("cancelled by")  # kept for requeue
    assert env.ctl("requeue", bad).stdout.strip() == "requeued 1"


def test_retention_is_the_operators_and_reaper_interval_0_keeps_everything(env):
    ok, bad, dropped = first_week(env)
    age(env, 2)
    sup = env.supervisor("--exit-when-empty", "--reaper-interval", "0", "--retention", "1d")
    assert sup.wait(60) == 0
    assert set(ok) <= set(statuses(env))
    sup = env.supervisor("--exit-when-empty", "--retention", "3d")
    assert sup.wait(60) == 0
    assert set(ok) <= set(statuses(env))
    sup = env.supervisor("--exit-when-empty", env={"JOBQ_RETENTION": "36h"})
    assert sup.wait(60) == 0
    assert statuses(env) == {bad: "failed", dropped: "failed"}
    assert "purged 3 succeeded task(s) older than 36h" in sup.log()


def test_prune_removes_them_now_and_says_how_many(env):
    ok, bad, dropped = first_week(env)
    age(env, 2)
    assert env.ctl("prune").stdout == "pruned 0 succeeded task(s) older than 7d\n"
    ini = env.tmp / "worker.ini"
    ini.write_text("retention = 1d\n")
    res = env.ctl("--config", str(ini), "prune", "--older-than", "3d")
    assert res.stdout == "pruned 0 succeeded task(s) older than 3d\n"
    assert set(ok) <= set(statuses(env))
    res = env.ctl("--config", str(ini), "prune")  # the worker's retention key
    assert res.stdout == "pruned 3 succeeded task(s) older than 1d\n"
    assert statuses(env) == {bad: "failed", dropped: "failed"}
    assert env.ctl("status").stdout.split()[3] == "succeeded=0"


def test_prune_with_retention_0_needs_older_than(env):
    env.push("true")
    res = env.ctl("prune", check=False, env={"JOBQ_RETENTION": "0"})
    one_usage_line(res, "--older-than")
    res = env.ctl("prune", "--older-than", "0", env={"JOBQ_RETENTION": "0"})
    assert res.stdout == "pruned 0 succeeded task(s) older than 0s\n"  # it never ran


def test_task_logs_of_an_earlier_run_go_and_a_running_tasks_file_stays(env):
    """--task-log-dir (issue 40): the worker's purge deletes a log past
    --task-output-retention that an earlier run left, keeps a younger one and an operator's
    file, and keeps the file of a task running here although the task aged it itself
    before the purge ran (the test knows it did: the earlier run's file was still there)."""
    logs = env.tmp / "logs"
    logs.mkdir()
    old, young = time.time() - 3 * DAY, time.time() - DAY
    for name, mtime in (("earlier.1.log", old), ("young.1.log", young), ("notes.txt", old)):
        (logs / name).write_text(f"{name}\n")
        os.utime(logs / name, (mtime, mtime))
    earlier, flag = logs / "earlier.1.log", env.tmp / "aged-before-the-purge"
    [task] = env.push(
        "echo run-marker; "
        f"for i in $(seq 1200); do LOG=$(grep -l '^run-marker$' {logs}/*.log) && break; "
        "sleep 0.05; done; "
        f"touch -d @{old:.0f} \"$LOG\"; "
        f"if [ -e {earlier} ]; then : > {flag}; fi; "
        f"for i in $(seq 1200); do [ -e {earlier} ] || break; sleep 0.05; done; "
        "echo done")
    sup = env.supervisor("--exit-when-empty", "--task-log-dir", "logs",
                         "--task-output-retention", "2d")
    assert sup.wait(80) == 0, sup.log()
    assert env.state(task) == "succeeded"
    assert flag.exists(), "the task started after the first purge: nothing was shown"
    assert "task-log-dir: deleted 1 task log(s) older than 2d" in sup.log()
    mine = log_name(task, 1)
    assert {p.name for p in logs.iterdir()} == {"young.1.log", "notes.txt", mine}
    assert (logs / mine).read_text() == "run-marker\ndone\n"
