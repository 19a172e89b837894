"""Faults on the test PostgreSQL server (tests/postgres/server.py), for the reliability and
server-fault tests:

* ``frozen(server)`` -- SIGSTOP of the postmaster and every backend for the block (then
  SIGCONT): a server that hangs.  Connections stay open and calls just wait; a new connection
  is accepted by the kernel and then gets no answer.
* ``through(url, port)`` -- the same connection string to another loopback port: a worker
  behind a FaultProxy (tests/faults/proxy.py).
* ``LeaseLog`` -- every ``locked_until`` the database sets on the jobs table, as it sets it
  (an AFTER UPDATE trigger on a table of the test's own), so a test can tell when the lease
  its task died under would have ended, even after the server was stopped or frozen.

Called from the test's thread.
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator
from datetime import datetime

import psutil
import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from tests.postgres.server import PgServer

SCHEMA = "jobq"  # the default --postgres-schema


def freeze(server: PgServer) -> list[psutil.Process]:
    """SIGSTOP the postmaster first (it forks no backend after that), then its children;
    the processes stopped."""
    pid = server.pid
    assert pid is not None, "the server is not running"
    postmaster = psutil.Process(pid)
    postmaster.send_signal(signal.SIGSTOP)
    procs = [postmaster]
    for child in postmaster.children(recursive=True):
        try:
            child.send_signal(signal.SIGSTOP)
            procs.append(child)
        except psutil.NoSuchProcess:
            pass
    return procs


def thaw(procs: list[psutil.Process]) -> None:
    """SIGCONT what ``freeze`` stopped (backends first, the postmaster last)."""
    for proc in reversed(procs):
        try:
            proc.send_signal(signal.SIGCONT)
        except psutil.NoSuchProcess:
            pass


@contextlib.contextmanager
def frozen(server: PgServer) -> Iterator[list[psutil.Process]]:
    """The server SIGSTOPped for the block; thawed however the block ends (the session's
    other tests share it)."""
    procs = freeze(server)
    try:
        yield procs
    finally:
        thaw(procs)


def port_of(url: str) -> int:
    return int(conninfo_to_dict(url)["port"])


def through(url: str, port: int) -> str:
    """``url`` (URI or key=value) to 127.0.0.1:``port`` instead."""
    return make_conninfo(url, host="127.0.0.1", port=str(port))


class LeaseLog:
    """Records each (id, owner, attempt, state, locked_until, at) the database writes to the
    jobs table of schema ``schema`` (``at``: the database's clock_timestamp()).  Install it
    once the schema exists."""

    def __init__(self, url: str, schema: str = SCHEMA) -> None:
        self.url = url
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("""
                CREATE TABLE public.test_lease_log (
                    id text, owner text, attempt int, state text, locked_until timestamptz,
                    at timestamptz);
                CREATE FUNCTION public.test_log_lease() RETURNS trigger LANGUAGE plpgsql AS $$
                BEGIN
                    INSERT INTO public.test_lease_log VALUES (NEW.id, NEW.owner, NEW.attempt,
                        NEW.state, NEW.locked_until, clock_timestamp());
                    RETURN NEW;
                END $$""")
            conn.execute(f'CREATE TRIGGER test_lease_log AFTER UPDATE ON "{schema}".jobs '
                         "FOR EACH ROW EXECUTE FUNCTION public.test_log_lease()")

    def locked_until(self, task_id: str, attempt: int, before: float) -> float | None:
        """The lease end (epoch s) of that attempt as the database last set it before the
        wall time ``before``: the lock a task that died at ``before`` held."""
        with psycopg.connect(self.url, autocommit=True) as conn:
            row = conn.execute(
                "SELECT locked_until FROM public.test_lease_log WHERE id=%s AND attempt=%s "
                "AND state='running' AND at < to_timestamp(%s) ORDER BY at DESC LIMIT 1",
                (task_id, attempt, before)).fetchone()
        if row is None or row[0] is None:
            return None
        value: datetime = row[0]
        return value.timestamp()

    def renewals(self, task_id: str, attempt: int) -> int:
        """How many times that attempt's lease was set while running (the receive included)."""
        with psycopg.connect(self.url, autocommit=True) as conn:
            row = conn.execute(
                "SELECT count(*) FROM public.test_lease_log WHERE id=%s AND attempt=%s "
                "AND state='running'", (task_id, attempt)).fetchone()
        return int(row[0]) if row else 0
