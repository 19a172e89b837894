"""The PostgreSQL options of both commands: --backend postgres, --postgres-url (env
JOBQ_POSTGRES_URL, INI key postgres-url), --postgres-schema (a plain identifier, else exit 2),
--postgres-notify, the 5-minute default lease renewed every lock/3, and the URL kept out of
the Settings' repr."""

from __future__ import annotations

import os

import pytest

from supervisor.ctl.main import ctl_main
from supervisor.worker.main import UsageError, parse_worker_settings

pytestmark = pytest.mark.timeout(30)
URL = "postgresql://worker:S3cretPw@db.example:5432/jobs?sslmode=verify-full"


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith(("JOBQ_", "PG")):
            monkeypatch.delenv(name)


def test_defaults_and_flags() -> None:
    s = parse_worker_settings(["--backend", "postgres"])
    assert (s.postgres_url, s.postgres_schema, s.postgres_notify) == (None, "jobq", "on")
    assert s.lock == 300.0 and s.renew_every == 100.0  # 5 minutes, renewed every lock/3
    s = parse_worker_settings(["--backend", "postgres", "--postgres-url", URL,
                               "--postgres-schema", "jobq_2", "--postgres-notify", "off"])
    assert (s.postgres_url, s.postgres_schema, s.postgres_notify) == (URL, "jobq_2", "off")
    assert parse_worker_settings(["--backend", "postgres", "--lock-duration", "30s"]
                                 ).renew_every == 10.0


def test_environment_and_ini(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.setenv("JOBQ_POSTGRES_URL", URL)
    ini = tmp_path / "worker.ini"
    ini.write_text("backend = postgres\npostgres-schema = other\npostgres-notify = off\n")
    s = parse_worker_settings(["--config", str(ini)])
    assert (s.backend, s.postgres_url, s.postgres_schema, s.postgres_notify) == (
        "postgres", URL, "other", "off")


def test_url_not_in_repr() -> None:
    s = parse_worker_settings(["--backend", "postgres", "--postgres-url", URL])
    assert "S3cretPw" not in repr(s) and "postgres_url='<redacted>'" in repr(s)


@pytest.mark.parametrize("name", ["Jobq", "1jobq", "pg_jobq", "jobq-x", "jobq.x", "", "a" * 64,
                                  'jobq"; DROP', "jöbq"])
def test_bad_schema_name_is_one_line_exit_2(name: str, capsys) -> None:
    with pytest.raises(UsageError) as info:
        parse_worker_settings(["--backend", "postgres", "--postgres-schema", name])
    assert str(info.value).startswith("--postgres-schema: invalid schema name")
    assert ctl_main(["--backend", "postgres", "--postgres-schema", name, "size"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("jobq-ctl: error: --postgres-schema:") and err.count("\n") == 1


def test_bad_notify_mode_is_exit_2(capsys) -> None:
    assert ctl_main(["--backend", "postgres", "--postgres-notify", "maybe", "size"]) == 2
    assert "--postgres-notify" in capsys.readouterr().err


def test_options_also_after_the_ctl_sub_command(capsys) -> None:
    """jobq-ctl takes the backend options before or after the sub-command: --print needs no
    server, and shows the schema given after ``migrate``."""
    assert ctl_main(["migrate", "--backend", "postgres", "--postgres-schema", "other",
                     "--print"]) == 0
    assert 'CREATE SCHEMA IF NOT EXISTS "other"' in capsys.readouterr().out
