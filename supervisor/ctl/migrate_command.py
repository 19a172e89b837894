"""``jobq-ctl migrate [--print]``: create or upgrade the PostgreSQL schema, or print its SQL
for a DBA (backends/postgres/schema.py does the work; main thread).  Only for ``--backend
postgres``: the other backends create what they need themselves."""

from __future__ import annotations

import argparse

from ..core.options import UsageError
from ..core.settings import Settings


def cmd_migrate(ns: argparse.Namespace, settings: Settings) -> int:
    """Migrate (one line on stdout: what was done) or print the SQL; exit 0.  Errors are
    raised for ctl/main.py: UsageError / BackendConfigError (exit 2), BackendError (1)."""
    if settings.backend != "postgres":
        raise UsageError(f"migrate: only for --backend postgres (the {settings.backend} "
                         f"backend creates what it needs itself)")
    from ..backends.postgres.schema import LATEST, migrate_command, sql_for

    schema = settings.postgres_schema
    if ns.print:
        print(sql_for(schema), end="")
        return 0
    before, after = migrate_command(settings)
    if before == after:
        print(f"schema {schema}: at version {after} already")
    elif before == 0:
        print(f"schema {schema}: created at version {after}")
    else:
        print(f"schema {schema}: upgraded from version {before} to {after}")
    assert after == LATEST
    return 0
