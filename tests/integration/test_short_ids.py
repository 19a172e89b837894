"""Short task ids (issue 30, 2): a unique prefix of 8 or more characters names a task in
jobq-ctl's logs/result/cancel/requeue and the dashboard's search, on SQLite and PostgreSQL
(``fenv``).  The lookups are ops/ calls in-process; real jobq-ctl processes only where the
point is the exit status and its one line; the search through Flask's test client."""

from __future__ import annotations

import sqlite3
import time

import psycopg
import pytest

from supervisor.backends import open_backend
from supervisor.backends.base import Backend
from supervisor.core.task import Task
from supervisor.ctl.main import ctl_main
from supervisor.dashboard.app import create_app
from supervisor.fleet.control.records import Cancel, ResultRecord
from supervisor.fleet.output.base import AttemptKey
from supervisor.fleet.output.open import open_output_store
from supervisor.ops.short_ids import AmbiguousId, resolve
from tests.dashboard.conftest import control_store, data_source

pytestmark = pytest.mark.timeout(60)
Q = "default"
A1, A2 = "c040527d" + "a" * 24, "c040527d" + "b" * 24  # one 8-character prefix
B = "d1e2f3a4" + "0" * 24


def _queue(e) -> Backend:
    backend = open_backend(e.settings(), for_ctl=True)
    backend.push([Task(cmd="true", id=A1), Task(cmd="true", id=A2),
                  Task(cmd="echo hi", id=B)])
    return backend


def _result(task_id: str, attempt: int) -> ResultRecord:
    now = time.time()
    return ResultRecord(queue=Q, task_id=task_id, attempt=attempt, outcome="failed",
                        reason="", tail="", exit_status=1, worker="w1", when=now,
                        started=now, finished=now)


def test_a_prefix_is_looked_up_in_the_queue_and_the_fleet_stores(fenv, close_at_end):
    backend = close_at_end(_queue(fenv))
    admin = backend.admin()
    assert admin is not None
    assert admin.ids_starting("c040527d", 10) == [A1, A2]
    assert admin.ids_starting("c040527d", 1) == [A1]

    def find(text: str, **where) -> str:
        return resolve(text, Q, where.get("admin"), where.get("store"), where.get("output"))

    assert find("d1e2f3a4", admin=admin) == B
    assert find("c040527db", admin=admin) == A2
    assert find(B, admin=admin) == B  # a whole id is itself
    assert find("d1e2f3a", admin=admin) == "d1e2f3a"  # 7 characters: never a prefix
    assert find("99999999", admin=admin) == "99999999"  # no match: the command says so
    with pytest.raises(AmbiguousId) as caught:
        find("c040527d", admin=admin)
    assert f"{A1}, {A2}" in str(caught.value) and "\n" not in str(caught.value)

    # What the fleet layer knows (Storage Queue, Service Bus): result records -- one per
    # attempt, walked one id at a time -- cancels, and kept output
    store = close_at_end(control_store(fenv))
    many, next_door = "e5e5e5e5" + "1" * 24, "e5e5e5e5" + "2" * 24
    odd = "job:2026/11%a"  # escaped in the store's keys
    store.put_results([_result(many, n) for n in range(1, 9)] + [_result(next_door, 1),
                                                               _result(odd, 1)])
    assert store.task_ids(Q, "e5e5e5e5", 6) == [many, next_door]
    assert store.task_ids(Q, "e5e5e5e5", 1) == [many]
    assert store.task_ids(Q, "job:2026", 6) == [odd]
    assert store.task_ids("other", "e5e5e5e5", 6) == []
    cancelled = "f6f6f6f6" + "3" * 24
    store.put_cancel(Cancel(queue=Q, task_id=cancelled, reason="", who="op", when=time.time()))
    assert find("f6f6f6f6", store=store) == cancelled
    assert find("e5e5e5e52", store=store) == next_door
    with pytest.raises(AmbiguousId):
        find("e5e5e5e5", store=store)
    output = open_output_store(fenv.settings())
    assert output is not None
    close_at_end(output)
    kept = "a7a7a7a7" + "4" * 24
    output.append(AttemptKey(Q, kept, 1), b"out\n")
    assert output.task_ids(Q, "a7a7a7a7", 6) == [kept]
    assert find("a7a7a7a7", output=output) == kept


def test_the_prefix_query_is_a_range_of_the_id_index(fenv, close_at_end):
    """The plan of the statement ids_starting runs (backends/*/admin.py) uses the index on
    the ids, so a prefix costs the same in a queue of a million tasks."""
    close_at_end(_queue(fenv))
    if isinstance(fenv.settings().postgres_url, str):
        from supervisor.backends.postgres.admin import BYTE_ORDER_SQL, PREFIX_SCAN_SQL, PREFIX_SQL

        with psycopg.connect(fenv.url, autocommit=True) as conn:
            # the test server's databases are C (initdb --locale=C): the range applies; a
            # linguistic collation's scan finds the same ids
            assert conn.execute(BYTE_ORDER_SQL).fetchone() == (True,)
            scan = conn.execute(PREFIX_SCAN_SQL.format(jobs="jobq.jobs"), (Q, "c040527d", 6))
            assert [i for (i,) in scan] == [A1, A2]
            conn.execute("SET enable_seqscan = off")  # a tiny table is scanned otherwise
            plan = "\n".join(r[0] for r in conn.execute(
                "EXPLAIN " + PREFIX_SQL.format(jobs="jobq.jobs"),
                ("c040527d", "c040527e", "c040527d", Q, 6)))
        assert "Index" in plan and "jobs_pkey" in plan and "Seq Scan" not in plan, plan
        assert "Index Cond: ((id >= " in plan, plan
    else:
        from supervisor.backends.sqlite.admin import PREFIX_SQL

        with sqlite3.connect(fenv.db) as conn:
            plan = " ".join(str(r[-1]) for r in conn.execute(
                "EXPLAIN QUERY PLAN " + PREFIX_SQL, (Q, "c040527d", "c040527e", 8,
                                                     "c040527d", 6)))
        assert "INDEX sqlite_autoindex_jobs_1 (queue=? AND id>? AND id<?)" in plan, plan


def test_jobq_ctl_takes_a_prefix_and_says_when_it_is_ambiguous(fenv, close_at_end,
                                                               monkeypatch, capsys):
    backend = close_at_end(_queue(fenv))
    fenv.serve()
    res = fenv.ctl("result", "c040527d", check=False)
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "result: task id prefix 'c040527d' is ambiguous" in lines[0]
    assert f"{A1}, {A2}" in lines[0]
    res = fenv.ctl("cancel", "d1e2f3a4", "--reason", "short")
    assert res.stdout.startswith(f"{B}: cancel")  # SQLite: taken off; PostgreSQL: recorded
    res = fenv.ctl("logs", "99999999", check=False)  # no match: today's "no task", exit 1
    assert res.returncode == 1
    assert res.stderr.strip() == f"jobq-ctl: error: logs: no task '99999999' in queue {Q}"
    # requeue, in-process: the cancelled task comes back by its prefix
    admin = backend.admin()
    assert admin is not None
    admin.cancel_pending([B], "cancelled by test", time.time())
    for name, value in fenv.secret_env().items():
        monkeypatch.setenv(name, value)
    capsys.readouterr()
    assert ctl_main([*fenv.base_args(), "requeue", "d1e2f3a4"]) == 0
    assert capsys.readouterr().out.strip() == "requeued 1"
    assert fenv.state(B) == "pending"


def test_dashboard_search_takes_a_prefix(fenv, close_at_end):
    close_at_end(_queue(fenv))
    client = create_app(data_source(fenv)).test_client()
    resp = client.get("/search?id=d1e2f3a4")
    assert resp.status_code == 302 and resp.location.endswith(f"/tasks/{B}?queue={Q}")
    assert B in client.get(resp.location).get_data(as_text=True)
    resp = client.get("/search?id=c040527d")
    body = resp.get_data(as_text=True)
    assert resp.status_code == 400 and A1 in body and A2 in body and "ambiguous" in body
    resp = client.get("/search?id=99999999")  # no match: the task page's 404
    assert resp.status_code == 302 and client.get(resp.location).status_code == 404
