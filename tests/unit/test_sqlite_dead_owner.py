"""Issue 25.1: a SQLite lease whose owner process is gone comes back at the next dead-owner
pass (sqlite_owner.py) -- real processes as owners, real files in tmp_path, the pass's
schedule on an injected clock."""

from __future__ import annotations

import logging
import os
import signal
import sqlite3
import subprocess
from collections.abc import Callable, Iterator

import pytest
from test_sqlite_backend import LOCK, SETTLEMENTS, push, row

from supervisor.backends.base import LeaseLost
from supervisor.backends.sqlite.backend import DEAD_OWNER_EVERY, SqliteBackend
from supervisor.backends.sqlite.owner import (
    ALIVE,
    DYING,
    GONE,
    UNKNOWN,
    DeadOwnerPass,
    identity,
    owner_state,
    start_ticks,
)
from tests.fakes.clock import FakeClock

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
def procs() -> Iterator[Callable[[], subprocess.Popen]]:
    """``start()`` runs a ``sleep`` that stands for a worker (or its lifeline); every one is
    killed and reaped at the end."""
    started: list[subprocess.Popen] = []

    def start() -> subprocess.Popen:
        started.append(subprocess.Popen(["sleep", "60"]))
        return started[-1]

    yield start
    for p in started:
        p.kill()
        p.wait()


def kill(p: subprocess.Popen, reap: bool = True) -> None:
    p.kill()
    if reap:
        p.wait()
    else:  # a zombie: dead, its pid not yet free
        os.waitid(os.P_PID, p.pid, os.WEXITED | os.WNOWAIT)


@pytest.fixture
def open_backend(db, close_at_end) -> Callable[..., SqliteBackend]:
    def make(worker: str, pids: tuple[int, ...] = (), **kwargs) -> SqliteBackend:
        """A backend of worker ``worker`` whose leases are held by ``pids`` (default: us)."""
        backend = close_at_end(SqliteBackend(db, "default", worker, **kwargs))
        if pids:
            backend.dead_owners = DeadOwnerPass("default", backend.max_attempts, pids)
        return backend

    return make


@pytest.fixture
def raw(db) -> Iterator[sqlite3.Connection]:
    conn = sqlite3.connect(db, isolation_level=None)
    yield conn
    conn.close()


def leased_by(open_backend, owner: subprocess.Popen, *cmds: str, helper=None, **kwargs):
    """Push ``cmds`` and receive them as worker A whose process is ``owner`` (and its
    lifeline ``helper``): A's backend and its leases."""
    pids = (owner.pid,) if helper is None else (owner.pid, helper.pid)
    a = open_backend("A", pids, **kwargs)
    push(a, *cmds)
    return a, a.receive(len(cmds), LOCK)


# ----------------------------------------------------------------------------- owner state
def test_owner_state_alive_stopped_zombie_reaped_and_recycled(procs) -> None:
    here = identity([os.getpid()])
    assert here is not None and owner_state(here, here) == ALIVE
    p = procs()
    theirs = identity([p.pid])
    assert theirs is not None and owner_state(theirs, here) == ALIVE
    os.kill(p.pid, signal.SIGSTOP)  # frozen, not dead: the 45-minute lease is for that
    assert owner_state(theirs, here) == ALIVE
    # the same pid, started at another time: a recycled pid is another process
    pid, start = theirs.rsplit(" ", 1)[1].split(":")
    assert owner_state(f"{theirs.rsplit(' ', 1)[0]} {pid}:{int(start) + 1}", here) == GONE
    kill(p, reap=False)
    assert start_ticks(p.pid) is None
    assert owner_state(theirs, here) == GONE
    p.wait()
    assert owner_state(theirs, here) == GONE


def test_owner_state_needs_every_holder_gone(procs) -> None:
    here = identity([os.getpid()])
    sup, lifeline = procs(), procs()
    both = identity([sup.pid, lifeline.pid])
    assert both is not None and owner_state(both, here) == ALIVE
    kill(sup)
    assert owner_state(both, here) == DYING  # the lifeline is still killing its tasks
    kill(lifeline)
    assert owner_state(both, here) == GONE
    # the lifeline gone first (killed by hand): the worker still runs its tasks
    sup, lifeline = procs(), procs()
    both = identity([sup.pid, lifeline.pid])
    kill(lifeline)
    assert owner_state(both, here) == ALIVE


def test_owner_state_of_another_host_namespace_or_boot() -> None:
    here = identity([os.getpid()])
    assert here is not None
    version, host, pidns, boot, me = here.split(" ")
    dead = f"{me.split(':')[0]}:1"  # our pid, another start: gone, if it were judged
    # another host, or a container's pid namespace: not ours to judge
    assert owner_state(" ".join([version, "elsewhere", pidns, boot, dead]), here) == UNKNOWN
    assert owner_state(" ".join([version, host, "pid:[1]", boot, dead]), here) == UNKNOWN
    assert owner_state(" ".join(["v0", host, pidns, boot, me]), here) == UNKNOWN
    assert owner_state("garbage", here) == UNKNOWN
    # this host before its last boot: every process of that boot ended
    assert owner_state(" ".join([version, host, pidns, "another-boot", me]), here) == GONE


# ------------------------------------------------------------------------------ the pass
def test_maintenance_takes_a_dead_owners_lease_back_every_few_seconds(open_backend, raw,
                                                                      procs, caplog) -> None:
    p = procs()
    _a, (lease,) = leased_by(open_backend, p, "sleep 1000")
    clock = FakeClock(100.0)
    b = open_backend("B")
    b.clock = clock
    b.maintenance()  # the owner lives: nothing happens
    assert row(raw, lease.message_id)["status"] == "running"
    kill(p)
    clock.now += DEAD_OWNER_EVERY - 0.1
    b.maintenance()  # not due yet
    assert row(raw, lease.message_id)["status"] == "running"
    clock.now += 0.1
    with caplog.at_level(logging.WARNING, logger="jobq.sqlite"):
        b.maintenance()
    r = row(raw, lease.message_id)
    assert (r["status"], r["attempt"], r["locked_by"], r["locked_until"]) == (
        "pending", 1, None, None)  # the attempt it ran counts
    assert f"worker A is gone (its process ended): took back 1 running task(s): " \
           f"{lease.message_id} pending" in caplog.text
    assert b.changed()  # the idle loop's probe receives at once
    (again,) = b.receive(1, LOCK)
    assert (again.message_id, again.attempt) == (lease.message_id, 2)


def test_the_last_attempt_of_a_dead_owner_fails(open_backend, raw, procs) -> None:
    p = procs()
    a = open_backend("A", (p.pid,))
    push(a, "x", max_attempts=1)  # the task's own limit, whoever takes it back
    (lease,) = a.receive(1, LOCK)
    kill(p)
    (taken,) = open_backend("B").taken_back_at_open  # a worker opening the file takes it
    assert (taken.id, taken.worker, taken.status) == (lease.message_id, "A", "failed")
    r = row(raw, lease.message_id)
    assert r["status"] == "failed"
    assert r["reason"] == "worker A is gone (its process ended) on the last attempt"


def test_an_empty_receive_takes_back_first(open_backend, procs) -> None:
    """A batch run (--exit-when-empty) ends at an empty receive: it must not be empty while
    a dead owner's task waits to come back."""
    p = procs()
    _a, (lease,) = leased_by(open_backend, p, "x")
    b = open_backend("B")
    assert b.receive(1, LOCK) == []
    kill(p)
    (again,) = b.receive(1, LOCK)
    assert (again.message_id, again.attempt) == (lease.message_id, 2)


def test_a_dead_owner_whose_lifeline_still_kills_is_coming_back(open_backend, raw,
                                                                procs) -> None:
    sup, lifeline = procs(), procs()
    _a, (lease,) = leased_by(open_backend, sup, "x", helper=lifeline)
    b = open_backend("B")
    kill(sup)
    assert b.receive(1, LOCK) == []
    assert b.leases_coming_back()  # an empty receive, but not an empty queue
    assert row(raw, lease.message_id)["status"] == "running"
    kill(lifeline)
    (again,) = b.receive(1, LOCK)
    assert again.message_id == lease.message_id and not b.leases_coming_back()


def test_opening_for_writes_takes_back(open_backend, db, raw, procs) -> None:
    p = procs()
    _a, (lease,) = leased_by(open_backend, p, "x")
    kill(p)
    reader = SqliteBackend(db, "default", "jobq-ctl", create=False)
    try:  # a read-only command changes nothing: it shows the task as its worker's, gone
        st = reader.status()
        assert [(r["id"], r.get("owner_gone")) for r in st.running] == [(lease.message_id,
                                                                          True)]
        assert st.note and "1 running task(s) belong to a worker that is gone" in st.note
    finally:
        reader.close()
    assert row(raw, lease.message_id)["status"] == "running"
    writer = open_backend("jobq-ctl")
    assert [t.id for t in writer.taken_back_at_open] == [lease.message_id]
    assert row(raw, lease.message_id)["status"] == "pending"
    assert writer.status().note is None


def test_a_live_owner_and_an_owner_of_another_host_stay(open_backend, raw, procs) -> None:
    p = procs()
    _a, (mine,) = leased_by(open_backend, p, "live")
    other = open_backend("C")
    push(other, "elsewhere")
    (theirs,) = other.receive(1, LOCK)
    here = other.dead_owners.here
    assert here is not None
    raw.execute("UPDATE jobs SET owner=? WHERE id=?",
                (here.replace(here.split(" ")[1], "other-host", 1), theirs.message_id))
    b = open_backend("B", stale_lock_age=0.0)
    assert b.take_back_dead() == [] and not b.leases_coming_back()
    assert {row(raw, i)["status"] for i in (mine.message_id, theirs.message_id)} == {"running"}
    # the stale-lock reaper stays for them: once their lock expired
    raw.execute("UPDATE jobs SET locked_until=0 WHERE id=?", (theirs.message_id,))
    assert b.reap() == 1
    assert row(raw, theirs.message_id)["status"] == "pending"


@pytest.mark.parametrize("redelivered", [False, True], ids=["before", "after-redelivery"])
@pytest.mark.parametrize("op", list(SETTLEMENTS), ids=list(SETTLEMENTS))
def test_fencing_after_a_dead_owner_pass(open_backend, raw, procs, op, redelivered) -> None:
    """The old owner is dead, but a late write of its lease (a renewal or settlement already
    on its way) must still change nothing: the pass and the next receive fence it off."""
    p = procs()
    _a, (old,) = leased_by(open_backend, p, "sleep 1000")
    b = open_backend("B")
    kill(p)
    assert len(b.take_back_dead()) == 1
    new = b.receive(1, LOCK) if redelivered else []
    snapshot = row(raw, old.message_id)
    with pytest.raises(LeaseLost):
        SETTLEMENTS[op](old)
    assert row(raw, old.message_id) == snapshot
    if new:
        new[0].complete()  # the new holder still can
        assert row(raw, old.message_id)["status"] == "succeeded"


def test_an_older_database_opened_read_only_shows_its_status(db) -> None:
    """A database made before the owner column: a read-only jobq-ctl adds nothing to it and
    still shows its running tasks."""
    conn = sqlite3.connect(db)
    conn.executescript(
        "CREATE TABLE jobs (seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT NOT NULL, queue "
        "TEXT NOT NULL, body TEXT NOT NULL, status TEXT NOT NULL, attempt INTEGER NOT NULL "
        "DEFAULT 0, max_attempts INTEGER, preemptions INTEGER NOT NULL DEFAULT 0, token "
        "INTEGER NOT NULL DEFAULT 0, locked_by TEXT, locked_at REAL, locked_until REAL, "
        "visible_at REAL NOT NULL DEFAULT 0, created_at REAL NOT NULL, updated_at REAL NOT "
        "NULL, reason TEXT, output_tail TEXT, exit_status INTEGER, priority INTEGER NOT NULL "
        "DEFAULT 5, unique_key TEXT);"
        "INSERT INTO jobs (id, queue, body, status, locked_by, created_at, updated_at) "
        "VALUES ('t1', 'default', '{}', 'running', 'old-worker', 0, 0);")
    conn.close()
    reader = SqliteBackend(db, "default", "jobq-ctl", create=False)
    try:
        st = reader.status()
    finally:
        reader.close()
    assert [(r["id"], r["worker"], r.get("owner_gone")) for r in st.running] == [
        ("t1", "old-worker", None)]
    conn = sqlite3.connect(db)
    try:
        assert "owner" not in {c[1] for c in conn.execute("PRAGMA table_info(jobs)")}
    finally:
        conn.close()
