"""Issue 30 (1): a queue's tasks by state, worker and text in the command, newest first, page
by page (keyset) -- ``QueueAdmin.list_tasks`` on SQLite and PostgreSQL through ops/, in the
test's process, and ``jobq-ctl tasks`` once as a user runs it."""

from __future__ import annotations

import json
import re
import time

import pytest

from supervisor.backends import open_backend
from supervisor.backends.task_list import BadCursor, TaskQuery
from supervisor.core.task import Task
from supervisor.ops.task_list import list_tasks

pytestmark = pytest.mark.timeout(90)


def _ids(rows) -> list[str]:
    return [r.id for r in rows]


@pytest.fixture
def tasks(fenv):
    """Seven tasks in every state: (backend, {name: id}); newest last in ``names``."""
    b = open_backend(fenv.settings(worker_id="w-list"))
    ids: dict[str, str] = {}

    def push(name: str, cmd: str, **kw) -> None:
        (ids[name],) = b.push([Task(cmd=cmd, **kw)])
        time.sleep(0.002)  # distinct push times (PostgreSQL orders by created_at)

    for name in ("ok", "bad", "busy"):
        push(name, f"echo {name}")
    ok, bad, busy = sorted(b.receive(3, 60), key=lambda lease: list(ids.values()).index(
        lease.task.id))
    ok.complete()
    bad.dead_letter("exit status 3", "", 3)
    push("waiting", "echo waiting 100%_done")
    push("later", "echo later", not_before=time.time() + 3600)
    push("gone", "echo gone")
    admin = b.admin()
    assert admin is not None
    assert admin.cancel_pending([ids["gone"]], "cancelled by test", time.time())
    push("quote", """echo 'say "hi" é' \\ """)
    yield b, ids
    busy.complete()
    b.close()


def test_states_worker_text_and_newest_first(tasks, fenv):
    b, ids = tasks

    def listed(**kw) -> list[str]:
        rows, note = list_tasks(b, None, "default", TaskQuery(**kw))
        assert note is None
        return _ids(rows)

    newest_first = [ids[n] for n in ("quote", "gone", "later", "waiting", "busy", "bad", "ok")]
    assert listed() == newest_first
    for state, names in (("pending", ["quote", "waiting"]), ("delayed", ["later"]),
                         ("running", ["busy"]), ("succeeded", ["ok"]), ("failed", ["bad"]),
                         ("cancelled", ["gone"])):
        assert listed(states=(state,)) == [ids[n] for n in names], state
    assert listed(states=("failed", "cancelled")) == [ids["gone"], ids["bad"]]
    assert listed(worker="w-list") == [ids[n] for n in ("busy", "bad", "ok")]
    assert listed(worker="nobody") == []
    assert listed(text="100%_done") == [ids["waiting"]], "% and _ are text, not wildcards"
    assert listed(text="0%_") == [ids["waiting"]]
    assert listed(text="%") == [ids["waiting"]]
    assert listed(text='"hi" é\' \\') == [ids["quote"]], "quotes, \\ and non-ASCII"
    rows, _ = list_tasks(b, None, "default", TaskQuery(states=("failed",)))
    (bad,) = rows
    assert (bad.state, bad.attempt, bad.exit_status, bad.worker, bad.cmd) == (
        "failed", 1, 3, "w-list", "echo bad")
    assert bad.ended is not None and bad.ended >= bad.created


def test_pages_follow_one_another_by_keyset(tasks):
    b, ids = tasks
    seen: list[str] = []
    cursor = None
    for _ in range(10):
        rows, _ = list_tasks(b, None, "default", TaskQuery(cursor=cursor, limit=3))
        seen += _ids(rows)
        if len(rows) < 3:
            break
        cursor = rows[-1].cursor
    assert seen == _ids(list_tasks(b, None, "default", TaskQuery(limit=100))[0])
    assert len(seen) == len(ids) == len(set(seen))
    # a page after a cursor of a filtered listing stays in the filter
    first, _ = list_tasks(b, None, "default", TaskQuery(states=("pending",), limit=1))
    rest, _ = list_tasks(b, None, "default", TaskQuery(states=("pending",),
                                                        cursor=first[0].cursor))
    assert _ids(first + rest) == [ids["quote"], ids["waiting"]]
    # a cursor no page printed: one clear error, not a driver's (jobq-ctl: exit 2, below)
    for bad in ("x", "12|", "2026-11-27|x", "|abc", "3.5"):
        with pytest.raises(BadCursor):
            list_tasks(b, None, "default", TaskQuery(cursor=bad))


def test_jobq_ctl_tasks(env):
    ids = env.push("echo a", "echo b", "echo c")
    out = env.ctl("tasks", "--limit", "2")
    header, *lines = out.stdout.splitlines()
    assert header.split() == ["ID", "STATE", "ATT", "PUSHED", "ENDED", "WORKER", "RESULT",
                              "COMMAND"]
    assert [line.split()[0] for line in lines] == ids[:0:-1]
    assert "--after" in out.stderr
    cursor = out.stderr.split("--after '")[1].split("'")[0]
    page = json.loads(env.ctl("tasks", "--json", "--after", cursor).stdout)
    assert [t["id"] for t in page["tasks"]] == ids[:1] and page["next"] is None
    assert page["tasks"][0]["state"] == "pending" and page["tasks"][0]["cmd"] == "echo a"
    bad = env.ctl("tasks", "--state", "done", check=False)
    assert bad.returncode == 2 and "unknown state 'done'" in bad.stderr
    assert "Traceback" not in bad.stderr
    bad = env.ctl("tasks", "--after", "page-2", check=False)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert bad.stderr.strip() == ("jobq-ctl: error: tasks: --after: 'page-2' is not a cursor a "
                                  "page of this queue printed")


def test_jobq_ctl_tasks_text_shows_push_and_end_times_and_how_each_ended(env):
    """Issue 41 (7): docs/fleet.rst promised push and end times and the exit status or reason;
    the lines had neither."""
    [ok, bad, waiting] = env.push("true", "exit 3", "sleep 1")
    env.ctl("cancel", waiting)
    env.supervisor("--exit-when-empty", "--max-attempts", "1").wait(60)
    header, *lines = env.ctl("tasks").stdout.splitlines()
    columns = {name: header.index(name) for name in ("ENDED", "RESULT", "COMMAND")}
    row = {line.split()[0]: line for line in lines}
    for tid, result, cmd in ((ok, "exit 0", "true"), (bad, "exit 3", "exit 3"),
                             (waiting, "cancelled", "sleep 1")):
        line = row[tid]
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ",
                            line[columns["ENDED"]:].split()[0]), line
        assert line[columns["RESULT"]:].startswith(result), line
        assert line[columns["COMMAND"]:] == cmd, line
