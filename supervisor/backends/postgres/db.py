"""What the queue (backend.py, lease.py, admin.py, retention.py) uses of a database: the
schema's tables by name, a connection of the main pool, one bounded statement on the lease
pool, and psycopg's errors mapped onto the seam's (connect.failure: one redacted line).

Threads: ``main()`` is the main thread's (and jobq-ctl's, a dashboard request's: each with a
backend of its own); ``lease_statement`` the lease threads', on the lease pool that nothing
else uses, so a renewal never waits behind a receive or an admin query; ``main_statement``
the worker's completer thread's, on a main-pool connection of its own.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from ..base import BackendError
from .connect import Conn, Pools, PoolTimeout, execute, failure, psycopg
from .connect_errors import describe
from .deadlines import DEADLINES
from .schema import Tables, wake_channel

MAIN_WAIT = 5.0  # s the main thread waits for a free connection of its pool
MAIN_BOUND_MIN = 1.0  # s: the least a worker's main-thread statement is given (a busy server)


class Database:
    """The pools of one backend (connect.open_pools) and the schema its tables are in."""

    def __init__(self, pools: Pools, schema: str) -> None:
        self.pools = pools
        # A worker's main-thread calls (receive, maintenance, push) end within this many
        # seconds, a hung server's too (deadlines.py cuts the socket): the main loop blocks no
        # longer than one poll interval and acts on its signals.  None (jobq-ctl, the schema
        # check at start): unbounded.  open.py sets it once the schema is checked.
        self.main_bound: float | None = None
        self.schema = schema
        self.tables = Tables.of(schema)
        self.wake_channel = wake_channel(schema)
        # for messages: host:port/dbname, never a password
        self.location = f"PostgreSQL schema {schema} on {describe(pools.url)}"

    @contextmanager
    def errors(self, what: str, duplicate: str | None = None) -> Iterator[None]:
        """psycopg's and the pool's errors in the block -> BackendError, one redacted line,
        not chained.  ``duplicate``: the line for a primary-key violation (a task id pushed
        twice)."""
        try:
            yield
        except psycopg.errors.UniqueViolation as exc:
            if duplicate is not None and (exc.diag.constraint_name or "").endswith("pkey"):
                raise BackendError(duplicate) from None
            raise failure(exc, what, self.pools.url) from None
        except (psycopg.Error, PoolTimeout) as exc:
            raise failure(exc, what, self.pools.url) from None

    @contextmanager
    def main(self, what: str, duplicate: str | None = None
             ) -> Iterator[Conn]:
        """A connection of the main pool (autocommit; ``conn.transaction()`` for more than
        one statement), its errors mapped as ``errors(what, duplicate)`` does.  With
        ``main_bound`` the wait for the connection and every statement in the block end within
        that many seconds (BackendError; a cut connection leaves the pool)."""
        bound = self.main_bound
        if bound is None:
            with self.errors(what, duplicate), \
                    self.pools.main.connection(timeout=MAIN_WAIT) as conn:
                yield conn
            return
        with self.errors(what, duplicate), DEADLINES.within(time.monotonic() + bound), \
                self.pools.main.connection(timeout=min(MAIN_WAIT, bound)) as conn, \
                DEADLINES.bounded(conn):
            yield conn

    def bound_main(self, poll_interval: float) -> None:
        """Bound the worker's main-thread calls by one poll interval, at least
        MAIN_BOUND_MIN (main thread, at start)."""
        self.main_bound = max(MAIN_BOUND_MIN, poll_interval)

    def lease_statement(self, sql: str, args: tuple[Any, ...], timeout: float) -> list[tuple]:
        """Run one statement on the lease pool, giving up within ``timeout`` seconds: the
        wait for a connection, then the statement under a statement timeout of the time left
        (lease threads).  Raises BackendError."""
        deadline = time.monotonic() + timeout
        if timeout <= 0:
            raise BackendError("PostgreSQL: lease write: no time left for the call")
        pool = self.pools.lease or self.pools.main  # jobq-ctl holds no leases of its own
        try:
            with self.errors("lease write"), DEADLINES.within(deadline), \
                    pool.connection(timeout=timeout) as conn, DEADLINES.bounded(conn):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise BackendError("PostgreSQL: lease write: no connection in time")
                return execute(conn, sql, args, timeout=left).fetchall()
        except BackendError:
            DEADLINES.suspect()  # the server may have restarted: check before lending again
            raise

    def main_statement(self, what: str, sql: str, args: tuple[Any, ...]) -> list[tuple]:
        """One statement on the main pool (the worker's completer thread; the pool lends
        it a connection the main thread's calls do not use), in a transaction of its own
        under a statement timeout of ``main_bound`` (MAIN_BOUND_MIN when unbounded), the
        socket cut at that bound too; its rows.  Raises BackendError."""
        bound = self.main_bound or MAIN_BOUND_MIN
        deadline = time.monotonic() + bound
        with self.errors(what), DEADLINES.within(deadline), \
                self.pools.main.connection(timeout=min(MAIN_WAIT, bound)) as conn, \
                DEADLINES.bounded(conn):
            left = deadline - time.monotonic()
            if left <= 0:
                raise BackendError(f"PostgreSQL: {what}: no connection in time")
            return execute(conn, sql, args, timeout=left).fetchall()

    def close(self) -> None:
        self.pools.close()

