"""The PostgreSQL schema: its tables (migration 1 is the contract the backend codes against),
versioned migrations under an advisory lock, the SQL a DBA applies by hand, and the check a
worker or jobq-ctl runs when it opens the queue.

All tables live in one schema S (``--postgres-schema``, default ``jobq``), shared by every
queue:

* ``S.meta(key, value)`` -- ``version`` -> the latest migration applied.
* ``S.queues(name, first_served)`` -- the queues a worker started on.
* ``S.control_records`` (migration ``_migration_control``) -- the fleet's control store
  (fleet/control/postgres.py): the generic records of fleet/control/base.py, keys in byte
  order (``COLLATE "C"``), and the sequence ``S.control_rev`` that numbers their versions.
* ``S.jobs`` -- one row per task, from push to its retention's end.  Partial indexes serve
  receive (pending rows in priority order), status (running rows), ``--unique-key`` (unique
  over pending and running rows) and retention (finished rows by ``ended_at``).  There is
  **no index on locked_until**: every renewal updates only that column, and with no index on
  it the update is HOT (heap-only: no index entry written, and the page is pruned without a
  vacuum); fillfactor 70 leaves the room on each page that a HOT update needs.  Per-table
  autovacuum settings keep a table that is rewritten all day small.
* ``S.outputs`` and ``S.output_chunks`` (``_migration_output``) -- the output store's
  (fleet/output/postgres.py): an attempt's end, run and ``complete`` flag, and its bytes in
  chunks keyed by byte position.

Wake-ups: ``NOTIFY`` on the channel ``wake_channel(S)`` (``"S.wake"``), the queue's name as
payload, in the push's transaction; a cancel, queue flag or command of the control store
``NOTIFY`` on ``control_channel(S)`` (``"S.control"``), in its write's transaction; task
output on ``output_channel(S)`` (``"S.output"``).

``migrate`` takes ``pg_advisory_xact_lock`` on a key derived from the schema's name: two
hosts migrating at once apply each step once, and a transaction-level lock also works
through PgBouncer in transaction mode.  ``sql_for`` is the same SQL as one script, for
``jobq-ctl migrate --print``.

Main thread (at open; ``jobq-ctl migrate``).
"""

from __future__ import annotations

import hashlib
from typing import NamedTuple

from ...core.build import version as build_version
from ...core.settings import POSTGRES_SCHEMA_NAME, Settings
from ..base import BackendConfigError, BackendError, QueueNotFound
from .connect import APP_CTL, Conn, connect, failure, one_line, psycopg

JOB_STATES = ("pending", "running", "succeeded", "failed")
DBA_HINT = "run `jobq-ctl migrate` (or have a DBA apply `jobq-ctl migrate --print`)"


class Tables(NamedTuple):
    """The schema's qualified, quoted names for SQL text (``Tables.of("jobq").jobs`` is
    ``"jobq".jobs``)."""

    schema: str
    meta: str
    queues: str
    jobs: str
    control_records: str
    control_rev: str  # a sequence
    outputs: str  # one row per attempt with output: its end, run and ``complete``
    output_chunks: str  # the attempts' bytes, one row per chunk

    @classmethod
    def of(cls, schema: str) -> Tables:
        q = quote_schema(schema)
        return cls(q, f"{q}.meta", f"{q}.queues", f"{q}.jobs", f"{q}.control_records",
                   f"{q}.control_rev", f"{q}.outputs", f"{q}.output_chunks")


def quote_schema(schema: str) -> str:
    """``"name"``: the schema as an SQL identifier.  Only names --postgres-schema accepts
    (lower-case letters, digits, ``_``), so quoting is exact and the name means the same
    quoted or not (what a DBA types in a GRANT)."""
    if not POSTGRES_SCHEMA_NAME.fullmatch(schema):
        raise BackendConfigError(f"--postgres-schema: invalid schema name {schema!r}")
    return f'"{schema}"'


def wake_channel(schema: str) -> str:
    """The NOTIFY channel of the schema's wake-ups, ``<schema>.wake``: the payload of
    ``pg_notify`` as is, and for ``LISTEN`` a quoted identifier (``LISTEN "jobq.wake"``)."""
    return f"{schema}.wake"


def control_channel(schema: str) -> str:
    """The NOTIFY channel of the control store's cancels, flags and commands,
    ``<schema>.control`` (quoted for ``LISTEN`` as ``wake_channel``'s); payload: the queue."""
    return f"{schema}.control"


def output_channel(schema: str) -> str:
    """The NOTIFY channel of the schema's task output, ``<schema>.output``: a notification
    with payload ``queue/task_id/attempt`` (task ids may hold ``/``: the attempt is after the
    last one, the queue before the first) follows an append's or a finish's commit, and a
    result record's write (jobq-ctl's followers LISTEN: ops/follow.py)."""
    return f"{schema}.output"


def lock_key(schema: str) -> int:
    """The advisory lock key of migrations of ``schema`` (a signed 64-bit int)."""
    digest = hashlib.sha256(f"jobq-supervisor migrate {schema}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


def _migration_1(t: Tables) -> list[str]:
    # Every statement is "if not exists": the printed script can be applied twice.
    return [
        f"CREATE SCHEMA IF NOT EXISTS {t.schema}",
        f"CREATE TABLE IF NOT EXISTS {t.meta} (key text PRIMARY KEY, value text NOT NULL)",
        f"CREATE TABLE IF NOT EXISTS {t.queues} (name text PRIMARY KEY, "
        f"first_served timestamptz)",
        f"""CREATE TABLE IF NOT EXISTS {t.jobs} (
    id text PRIMARY KEY,
    queue text NOT NULL,
    state text NOT NULL DEFAULT 'pending'
        CHECK (state IN ('pending', 'running', 'succeeded', 'failed')),
    priority smallint NOT NULL DEFAULT 5 CHECK (priority BETWEEN 0 AND 9),
    run_at timestamptz NOT NULL DEFAULT now(),
    body text NOT NULL,
    unique_key text,
    attempt int NOT NULL DEFAULT 0,
    owner text,
    locked_until timestamptz,
    created_at timestamptz NOT NULL DEFAULT now(),
    started_at timestamptz,
    ended_at timestamptz,
    reason text,
    output_tail text,
    exit_status int,
    worker text
) WITH (fillfactor = 70,
        autovacuum_vacuum_scale_factor = 0.01,
        autovacuum_analyze_scale_factor = 0.02,
        autovacuum_vacuum_cost_delay = 0)""",
        f"CREATE INDEX IF NOT EXISTS jobs_pending ON {t.jobs} "
        f"(queue, priority DESC, run_at, id) WHERE state = 'pending'",
        f"CREATE INDEX IF NOT EXISTS jobs_running ON {t.jobs} (queue) WHERE state = 'running'",
        f"CREATE UNIQUE INDEX IF NOT EXISTS jobs_unique_key ON {t.jobs} (queue, unique_key) "
        f"WHERE unique_key IS NOT NULL AND state IN ('pending', 'running')",
        f"CREATE INDEX IF NOT EXISTS jobs_ended ON {t.jobs} (ended_at) "
        f"WHERE state IN ('succeeded', 'failed')",
    ]


def _migration_control(t: Tables) -> list[str]:
    """The control store's records (fleet/control/postgres.py).  ``part``/``row`` compare
    byte by byte (``COLLATE "C"``) whatever the database's collation: the store reads key
    ranges (``row >= 'cancel:' AND row < 'cancel;'``) that a linguistic collation would
    reorder.  ``expires``: a cancel's own end (``when + ttl``), for the purge."""
    return [
        f"""CREATE TABLE IF NOT EXISTS {t.control_records} (
    part text COLLATE "C" NOT NULL,
    row text COLLATE "C" NOT NULL,
    kind text NOT NULL,
    at double precision NOT NULL,
    rev bigint NOT NULL,
    expires double precision,
    doc text NOT NULL,
    PRIMARY KEY (part, row)
) WITH (autovacuum_vacuum_scale_factor = 0.02,
        autovacuum_analyze_scale_factor = 0.05)""",
        f"CREATE SEQUENCE IF NOT EXISTS {t.control_rev} AS bigint",
        f"CREATE INDEX IF NOT EXISTS control_cancels ON {t.control_records} (part, rev) "
        f"WHERE kind = 'cancel'",
        f"CREATE INDEX IF NOT EXISTS control_by_age ON {t.control_records} (kind, at)",
    ]


def _migration_output(t: Tables) -> list[str]:
    """The output store's tables (fleet/output/postgres.py).  ``outputs``: one row per
    attempt, updated by every append (its end, ``size``, the fencing condition), so it gets
    fillfactor 70 and the jobs table's autovacuum settings; ``updated_at`` is indexed for the
    retention purge.  ``output_chunks``: insert-only rows keyed by their byte position, whose
    ``data`` is compressed with lz4 (measured on 100 MiB of log lines in 1 MiB chunks: 33 MiB
    on disk and ~80 MiB/s written, against 29 MiB and ~20 MiB/s with the default pglz and
    103 MiB and 20-90 MiB/s uncompressed; a 1-byte read ~0.8 ms in each); deleted only by
    the purge."""
    return [
        f"""CREATE TABLE IF NOT EXISTS {t.outputs} (
    queue text NOT NULL,
    task_id text NOT NULL,
    attempt int NOT NULL,
    run int NOT NULL DEFAULT 1,
    size bigint NOT NULL DEFAULT 0,
    complete boolean NOT NULL DEFAULT false,
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (queue, task_id, attempt)
) WITH (fillfactor = 70,
        autovacuum_vacuum_scale_factor = 0.01,
        autovacuum_analyze_scale_factor = 0.02,
        autovacuum_vacuum_cost_delay = 0)""",
        f"CREATE INDEX IF NOT EXISTS outputs_updated ON {t.outputs} (updated_at)",
        f"""CREATE TABLE IF NOT EXISTS {t.output_chunks} (
    queue text NOT NULL,
    task_id text NOT NULL,
    attempt int NOT NULL,
    pos bigint NOT NULL,
    data bytea NOT NULL,
    PRIMARY KEY (queue, task_id, attempt, pos)
) WITH (autovacuum_vacuum_scale_factor = 0.05,
        autovacuum_vacuum_insert_scale_factor = 0.05,
        autovacuum_vacuum_cost_delay = 0,
        toast.autovacuum_vacuum_scale_factor = 0.05,
        toast.autovacuum_vacuum_cost_delay = 0)""",
        # lz4 where the server has it (PostgreSQL 14+ built with it), else the default pglz
        f"DO $$ BEGIN ALTER TABLE {t.output_chunks} ALTER COLUMN data SET COMPRESSION lz4; "
        f"EXCEPTION WHEN OTHERS THEN NULL; END $$",
    ]


# Migration N (1-based) -> its statements; append, never edit one that was released.
MIGRATIONS = (_migration_1, _migration_control, _migration_output)
LATEST = len(MIGRATIONS)


def _set_version(t: Tables, version: int) -> str:
    return (f"INSERT INTO {t.meta} (key, value) VALUES ('version', '{version}') "
            f"ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value "
            f"WHERE {t.meta}.value::int < {version}")


def sql_for(schema: str) -> str:
    """The whole schema as one SQL script (``jobq-ctl migrate --print``): every migration in
    one transaction, under the same advisory lock as ``migrate``; safe to apply again."""
    t = Tables.of(schema)
    lines = [f"-- jobq-supervisor schema {schema}, version {LATEST}",
             "BEGIN;", f"SELECT pg_advisory_xact_lock({lock_key(schema)});"]
    for number, migration in enumerate(MIGRATIONS, 1):
        lines.append(f"-- migration {number}")
        lines += [f"{stmt};" for stmt in migration(t)]
        lines.append(f"{_set_version(t, number)};")
    lines.append("COMMIT;")
    return "\n".join(lines) + "\n"


def read_version(conn: Conn, schema: str) -> int:
    """The schema's version: 0 when it has no ``meta`` table (or no schema at all)."""
    exists = conn.execute(
        "SELECT 1 FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n "
        "ON n.oid = c.relnamespace WHERE n.nspname = %s AND c.relname = 'meta'",
        (schema,)).fetchone()
    if not exists:
        return 0
    row = conn.execute(f"SELECT value FROM {Tables.of(schema).meta} WHERE key = 'version'"
                       ).fetchone()
    return int(row[0]) if row else 0


def _newer(schema: str, version: int) -> BackendConfigError:
    """A schema a newer build migrated: this build refuses it, one line, exit 2 (as SQLite's
    backends/sqlite/versions.py; docs/production.rst "Downgrades")."""
    return BackendConfigError(
        f"PostgreSQL: schema {schema} has version {version}; this build ({build_version()}) "
        f"knows up to {LATEST}: upgrade jobq-supervisor here, or see docs/production.rst "
        f'"Downgrades"')


def migrate(conn: Conn, schema: str) -> tuple[int, int]:
    """Create or upgrade ``schema`` to LATEST; returns (version before, version after).

    One transaction under ``pg_advisory_xact_lock(lock_key(schema))``: a second host waits,
    then finds the work done.  A schema newer than LATEST is BackendConfigError.  psycopg
    errors propagate (``check_schema`` and the migrate command map them).  ``conn``: an
    autocommit connection (the pools lend them so)."""
    t = Tables.of(schema)
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (lock_key(schema),))
        before = read_version(conn, schema)
        if before > LATEST:
            raise _newer(schema, before)
        for number in range(before + 1, LATEST + 1):
            for stmt in MIGRATIONS[number - 1](t):
                conn.execute(stmt)
            conn.execute(_set_version(t, number))
    return before, max(before, LATEST)


def check_schema(conn: Conn, schema: str, create: bool,
                 url: str | None = None) -> int:
    """Make sure ``schema`` is at LATEST before the queue is used; returns the version.

    Missing or older and ``create`` (a worker, ``push``): migrate when the role may, else
    BackendConfigError naming ``jobq-ctl migrate`` (exit 2).  Missing or older and not
    ``create`` (the read-only jobq-ctl commands): QueueNotFound, "does not exist" (exit 1),
    and nothing created.  Newer than LATEST: BackendConfigError (exit 2).  Other psycopg
    errors: BackendError.  ``url`` only to redact messages."""
    try:
        version = read_version(conn, schema)
        if version == LATEST:
            return version
        if version > LATEST:
            raise _newer(schema, version)
        if not create:
            what = "does not exist" if version == 0 else f"is at version {version}, older " \
                   f"than this jobq-supervisor's ({LATEST})"
            raise QueueNotFound(f"PostgreSQL: schema {schema} {what}; {DBA_HINT}")
        migrate(conn, schema)
        return LATEST
    except psycopg.Error as exc:
        raise _migrate_failure(exc, schema, url, DBA_HINT) from None


def _migrate_failure(exc: psycopg.Error, schema: str, url: str | None,
                     hint: str) -> BackendConfigError | BackendError:
    if isinstance(exc, psycopg.errors.InsufficientPrivilege):
        return BackendConfigError(
            f"PostgreSQL: this role may not create or upgrade schema {schema} "
            f"({one_line(exc, url)}); {hint}")
    return failure(exc, f"schema {schema}", url)


def migrate_command(settings: Settings) -> tuple[int, int]:
    """``jobq-ctl migrate`` (main thread): connect, ``migrate``, close; (version before,
    after).  Cannot connect: BackendError (exit 1); a role without the privileges or a newer
    schema: BackendConfigError (exit 2)."""
    url, schema = settings.postgres_url, settings.postgres_schema
    conn = connect(url, application_name=APP_CTL, prepare=settings.postgres_notify == "on")
    try:
        return migrate(conn, schema)
    except psycopg.Error as exc:
        raise _migrate_failure(exc, schema, url, "have a DBA run `jobq-ctl migrate` as the "
                               "schema's owner or apply `jobq-ctl migrate --print`") from None
    finally:
        conn.close()
