"""Connections to PostgreSQL (psycopg 3, psycopg_pool): the connection string, the two pools,
statements with a server-side timeout, and the errors that leave this package.

* ``conninfo`` -- ``--postgres-url`` (URI or ``key=value``; empty: libpq's ``PG*`` variables
  and ``~/.pgpass``) plus our defaults where the URL sets none: ``application_name``,
  ``connect_timeout`` and TCP keepalives / ``tcp_user_timeout`` (a dead or black-holed server
  breaks an idle connection in about a minute instead of the kernel's hours).
* ``open_pools`` -- TWO pools: ``main`` for the main thread's work (receive, push, the
  reaper, admin commands) and ``lease`` for the lease threads (renewals, settlements), so a
  renewal never waits for a connection behind a slow receive or admin query.  The first
  connection is made directly (``connect``), so that a wrong password or a missing database
  is one clear line at start instead of a pool's timeout.
* ``execute`` -- one statement under ``SET LOCAL statement_timeout``, in one round trip.
* ``redact`` -- every message that leaves this package goes through it: no password, in
  URI form, ``key=value`` form or quoted, ever reaches a log line or an error (psycopg's own
  log records too: library_log.py, which also makes them one line and rate-limits them).
* ``failure`` -- maps a psycopg error onto BackendConfigError (exit 2: the configuration can
  never work) or BackendError (transient, retried).

Behind PgBouncer in transaction mode (``--postgres-notify off``) psycopg must not prepare
statements (``prepare_threshold=None``); nothing here uses session state beyond one
transaction (``SET LOCAL``, transaction-level advisory locks).

Called from the main thread (``open_pools``, ``connect``) and from any thread (``execute``,
``redact``, ``failure``; the pools are thread-safe).
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ...core.settings import Settings
from ...core.threads import signals_blocked
from ..base import BackendConfigError, BackendError, BackendRefused

try:
    import psycopg
    import psycopg.conninfo
    from psycopg_pool import ConnectionPool, PoolTimeout
except ImportError as exc:  # the 'postgres' extra is not installed
    raise BackendConfigError(
        "--backend postgres needs psycopg 3 and psycopg-pool: pip install "
        "'jobq-supervisor[postgres]'") from exc

from .connect_errors import describe, explain  # noqa: E402
from .deadlines import DEADLINES, Conn  # noqa: E402 (needs psycopg, checked just above)
from .library_log import tame  # noqa: E402

APP_WORKER = "jobq-supervisor"  # application_name: what pg_stat_activity shows
APP_CTL = "jobq-ctl"
CONNECT_TIMEOUT = 10  # s: libpq's connect_timeout unless the URL sets one
# Defaults where the URL sets none.  tcp_user_timeout: sent data unacknowledged this long
# (a black-holed link) breaks the connection; keepalives: an idle one (the LISTEN
# connection, a pooled one) learns of a dead server in idle + interval * count seconds.
CONNECTION_DEFAULTS = {"keepalives": "1", "keepalives_idle": "30", "keepalives_interval": "10",
                       "keepalives_count": "3", "tcp_user_timeout": "30000"}
USER_TIMEOUT = 30.0  # s: the default tcp_user_timeout, the longest the pools use
MAIN_POOL_MAX = 4  # main thread (receive, push, reaper) + the completer + an admin query
POOL_CLOSE_TIMEOUT = 5.0  # s: pool.close waits this long for its threads

LOG = logging.getLogger("supervisor.backends.postgres")

# -- redaction ---------------------------------------------------------------------------
# URI userinfo: scheme://user:PASSWORD@host (the password up to the token's last '@', so an
# unencoded '@' in it leaks nothing).
_URI_PASSWORD = re.compile(r"(?P<pre>[A-Za-z][A-Za-z0-9+.-]*://[^\s:/?#@]*:)\S*@")
# key=value and URI query forms: password=..., 'quoted with \' and spaces', "double".
_KV_PASSWORD = re.compile(
    r"(?P<pre>\bpassword\s*=\s*)(?:'(?:[^'\\]|\\.)*'?|\"(?:[^\"\\]|\\.)*\"?|\S+)",
    re.IGNORECASE)
MASK = "***"
_MIN_LITERAL = 4  # shorter literal passwords are not replaced everywhere (they mangle text)


def redact(text: str, url: str | None = None) -> str:
    """``text`` without passwords: URI ``user:pass@``, ``password=...`` (plain or quoted), and
    the literal password of ``url`` and of ``$PGPASSWORD`` wherever it appears (any thread)."""
    text = _URI_PASSWORD.sub(lambda m: m.group("pre") + MASK + "@", text)
    text = _KV_PASSWORD.sub(lambda m: m.group("pre") + MASK, text)
    for secret in _literal_passwords(url):
        text = text.replace(secret, MASK)
    return text


def _literal_passwords(url: str | None) -> list[str]:
    found = [os.environ.get("PGPASSWORD") or ""]
    if url:
        try:
            found.append(str(psycopg.conninfo.conninfo_to_dict(url).get("password") or ""))
        except psycopg.Error:
            pass  # not parseable: the patterns above did what can be done
    return [s for s in found if len(s) >= _MIN_LITERAL]


# psycopg's own log lines (the pool's "error connecting ...") redacted too, one line each and
# not one per retry (library_log.py)
tame(("psycopg", "psycopg_pool"), redact)


# -- connection strings --------------------------------------------------------------------
def conninfo(url: str | None, application_name: str, user_timeout: float | None = None) -> str:
    """The libpq connection string: ``url`` (None or empty: libpq's ``PG*`` variables and
    ``~/.pgpass``) with our defaults where it sets none; ``user_timeout`` (s) instead of the
    default ``tcp_user_timeout``.  A string libpq cannot parse is a BackendConfigError naming
    ``--postgres-url`` (redacted)."""
    try:
        given = psycopg.conninfo.conninfo_to_dict(url or "")
    except psycopg.Error as exc:
        raise BackendConfigError(
            f"--postgres-url: not a libpq connection string: {one_line(exc, url)}") from None
    defaults: dict[str, Any] = {"application_name": application_name,
                                "connect_timeout": str(CONNECT_TIMEOUT), **CONNECTION_DEFAULTS}
    if user_timeout is not None:
        defaults["tcp_user_timeout"] = str(max(1000, int(user_timeout * 1000)))
    extra = {k: v for k, v in defaults.items() if k not in given and _env_unset(k)}
    try:
        return psycopg.conninfo.make_conninfo(url or "", **extra)
    except psycopg.Error as exc:
        raise BackendConfigError(
            f"--postgres-url: not a libpq connection string: {one_line(exc, url)}") from None


# libpq's environment variables for the settings we default (a PG* variable the operator set
# wins over our default, as it would over libpq's own).
_ENV = {"application_name": "PGAPPNAME", "connect_timeout": "PGCONNECT_TIMEOUT",
        "tcp_user_timeout": "PGTCPUSERTIMEOUT"}


def _env_unset(key: str) -> bool:
    return not os.environ.get(_ENV.get(key, ""), "")


# -- connections and pools -----------------------------------------------------------------
def connect(url: str | None, *, application_name: str, prepare: bool = True,
            fatal: bool = False, autocommit: bool = True) -> Conn:
    """One connection (main thread: at start; the LISTEN connection).  ``prepare=False``:
    never prepare statements (PgBouncer transaction mode).  Any failure to connect is
    BackendConfigError when ``fatal`` (the worker at start: a wrong password, a missing
    database, a refused TLS handshake or an unreachable server is exit 2), else BackendError
    (jobq-ctl: exit 1; a reconnect: retried)."""
    info = conninfo(url, application_name)
    try:
        return psycopg.connect(info, autocommit=autocommit,
                               prepare_threshold=None if not prepare else 5)
    except psycopg.Error as exc:
        raise failure(exc, f"cannot connect to {describe(url)}", url, fatal=fatal,
                      connecting=True) from None


@dataclass
class Pools:
    """The two pools: ``main`` (the main thread's statements) and ``lease`` (renewals and
    settlements; None for jobq-ctl).  ``url`` only for redacting messages."""

    main: ConnectionPool
    lease: ConnectionPool | None
    url: str | None
    prepare: bool

    def close(self) -> None:
        """Close both pools (main thread; idempotent)."""
        for pool in (self.lease, self.main):
            if pool is not None and not pool.closed:
                pool.close(timeout=POOL_CLOSE_TIMEOUT)
        DEADLINES.stop()


def open_pools(settings: Settings, *, for_ctl: bool) -> Pools:
    """The pools for ``settings`` (main thread).  A first connection is made and closed
    right away (``connect``): its failure is the one-line error -- BackendConfigError for a
    worker (exit 2), BackendError for jobq-ctl (exit 1).  The lease pool holds up to
    ``--num-workers`` connections (one per running task at worst; idle ones close after 10
    minutes) and, once a lease call failed, checks each connection before lending it again
    (deadlines.py ``check``): after a server restart the retry gets a live one instead of
    spending its try on a dead one.  The pools' connections break
    after ``tcp_user_timeout`` = min(30 s, renew interval) of unacknowledged data (unless the
    URL sets it)."""
    app = APP_CTL if for_ctl else APP_WORKER
    prepare = settings.postgres_notify == "on"
    url = settings.postgres_url
    connect(url, application_name=app, prepare=prepare, fatal=not for_ctl).close()
    # A renewal sent into a black-holed link breaks within one renew interval (at most the
    # default 30 s), so that its retry still comes before the lease deadline.
    info = conninfo(url, app, user_timeout=min(USER_TIMEOUT, settings.renew_every))
    kwargs: dict[str, Any] = {"autocommit": True}
    if not prepare:
        kwargs["prepare_threshold"] = None
    main = ConnectionPool(info, kwargs=kwargs, min_size=1,
                          max_size=1 if for_ctl else MAIN_POOL_MAX, open=False,
                          name="jobq-main", num_workers=1)
    lease = None if for_ctl else ConnectionPool(
        info, kwargs=kwargs, min_size=1, max_size=max(1, settings.num_workers), open=False,
        name="jobq-lease", num_workers=1, check=DEADLINES.check)
    pools = Pools(main, lease, url, prepare)
    try:
        with signals_blocked():  # the pools' threads start here and inherit the mask
            for pool in (main, lease):
                if pool is not None:
                    pool.open(wait=True, timeout=float(CONNECT_TIMEOUT))
    except psycopg.Error as exc:
        pools.close()
        raise failure(exc, f"cannot connect to {describe(url)}", url,
                      fatal=not for_ctl, connecting=True) from None
    return pools


# -- statements ------------------------------------------------------------------------------
def statement_timeout_ms(timeout: float) -> int:
    """``timeout`` seconds as statement_timeout milliseconds, at least 1 (0 would mean none)."""
    return max(1, int(timeout * 1000))


def execute(conn: Conn, sql: str,
            params: Sequence[Any] | Mapping[str, Any] | None = None, *,
            timeout: float) -> psycopg.Cursor[Any]:
    """Run one statement in a transaction of its own under ``SET LOCAL statement_timeout``
    (``timeout`` s), in one round trip (a pipeline: BEGIN, set_config, the statement,
    COMMIT); any thread, on a connection it holds (autocommit, as the pools lend them).  The
    cursor's rows are already here.  psycopg errors propagate: map them with ``failure``.
    ``SET LOCAL`` ends with the transaction, so this works through PgBouncer too."""
    try:
        with conn.pipeline():
            conn.execute("BEGIN")
            conn.execute("SELECT set_config('statement_timeout', %s, true)",
                         (f"{statement_timeout_ms(timeout)}ms",))
            cur = conn.execute(sql, params)
            conn.execute("COMMIT")
    except BaseException:
        if not conn.closed and conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
            try:
                conn.rollback()
            except psycopg.Error:
                pass  # a broken connection: the pool discards it when it comes back
        raise
    return cur


# -- errors ----------------------------------------------------------------------------------
def one_line(exc: BaseException, url: str | None = None) -> str:
    """``exc`` as one redacted line (libpq's "connection failed:" and "FATAL:" dropped)."""
    text = str(exc).replace("connection failed: ", "", 1)
    text = re.sub(r"\bFATAL:\s+", "", text)
    return redact(" ".join(text.split()), url) or type(exc).__name__


# psycopg names the statements it prepares "_pg3_<n>", per connection: on a server of its
# own one never vanishes, collides or changes its parameters.  Only a pooler that hands one
# client's transactions to several server connections does that -- PgBouncer in transaction
# mode before 1.21 (or without max_prepared_statements) -- and --postgres-notify off makes
# psycopg prepare nothing.
POOLER_HINT = ("a connection pooler in transaction mode (PgBouncer?) is between this host and "
               "the server: set --postgres-notify off")


def lost_prepared_statement(exc: BaseException) -> bool:
    """``exc`` says that a statement psycopg prepared is gone, taken or another one on the
    server connection it reached: the sign of transaction pooling (any thread)."""
    return isinstance(exc, (psycopg.errors.InvalidSqlStatementName,
                            psycopg.errors.DuplicatePreparedStatement,
                            psycopg.errors.ProtocolViolation)) and '"_pg3_' in str(exc)


def failure(exc: BaseException, what: str, url: str | None = None, *,
            fatal: bool = False, connecting: bool = False) -> BackendError | BackendConfigError:
    """The error to raise for ``exc`` met while doing ``what`` ("cannot connect to ...",
    "receive"): one redacted line starting with ``PostgreSQL: what: ``.  A statement timeout
    says so; a lost prepared statement names the pooler and ``--postgres-notify off``;
    ``connecting``: an unreachable server or a missing password in plain words
    (connect_errors.py).  ``fatal``: a configuration that can never work
    (BackendConfigError, exit 2); else BackendError (transient)."""
    plain = explain(one_line(exc, url), url, CONNECT_TIMEOUT) \
        if connecting and isinstance(exc, psycopg.OperationalError) else None
    if plain is not None:
        detail = redact(plain, url)
    elif isinstance(exc, psycopg.errors.QueryCanceled):
        detail = "timed out (statement_timeout)"
    elif lost_prepared_statement(exc):
        detail = f"{one_line(exc, url)}; {POOLER_HINT}"
    elif isinstance(exc, PoolTimeout):
        detail = "no connection in time (the server is slow or unreachable)"
    else:
        detail = one_line(exc, url)
    message = f"PostgreSQL: {redact(what, url)}: {detail}"
    if fatal:
        return BackendConfigError(message)
    if isinstance(exc, psycopg.errors.InsufficientPrivilege):
        return BackendRefused(message)  # the role's GRANTs: no retry makes it work
    return BackendError(message)
