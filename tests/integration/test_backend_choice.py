"""Issue 41 §1: a backend's own option given without ``--backend`` selects that backend, and
an option of one backend beside another backend is exit 2, one line naming both -- for both
commands, from flags, ``JOBQ_*`` variables and the INI file alike; a ``--backend`` overrides
the options of a lower source (the shipped INI file's ``sqlite-path``) as it overrides that
source's ``backend``.  Real processes; servers are not needed: ``--check-config`` names the
backend without opening a queue, and conflicts are refused before anything is opened.  The
implied PostgreSQL worker that serves a real queue: tests/postgres/test_implied_backend.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from supervisor.core.backend_choice import connection_string_backend
from tests.integration.helpers import one_usage_line
from tests.integration.test_config_file_and_queues import run

pytestmark = pytest.mark.timeout(120)

REPO = Path(__file__).resolve().parents[2]
PG_URL = "postgresql://jobq_worker@db.invalid/jobs"
STORAGE = ("DefaultEndpointsProtocol=https;AccountName=acct;AccountKey=a2V5;"
           "EndpointSuffix=core.windows.net")
SERVICEBUS = "Endpoint=sb://ns.servicebus.windows.net/;SharedAccessKeyName=k;SharedAccessKey=v"


def _check(tmp_path: Path, *args: str, env: dict[str, str] | None = None):
    return run("jobq-supervisor", *args, "--check-config", cwd=tmp_path, env=env)


def _ini(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "worker.ini"
    path.write_text("[jobq-supervisor]\n" + text)
    return path


@pytest.mark.parametrize("args, env, backend", [
    (["--postgres-url", PG_URL], {}, "postgres"),
    ([], {"JOBQ_POSTGRES_URL": PG_URL}, "postgres"),
    (["--postgres-schema", "other"], {}, "postgres"),
    ([], {"JOBQ_POSTGRES_NOTIFY": "off"}, "postgres"),
    (["--connection-string", STORAGE], {}, "storage-queue"),
    ([], {"JOBQ_CONNECTION_STRING": SERVICEBUS}, "servicebus"),
    (["--account-url", "https://acct.queue.core.windows.net"], {}, "storage-queue"),
    (["--namespace", "ns.servicebus.windows.net"], {}, "servicebus"),
    (["--sqlite-path", "q.db"], {}, "sqlite"),
    ([], {"JOBQ_POSTGRES_URL": ""}, "sqlite"),  # an empty variable is no value
    # a --backend flag overrides a variable of another backend, as flags override variables
    (["--backend", "sqlite"], {"JOBQ_POSTGRES_URL": PG_URL}, "sqlite"),
])
def test_an_option_of_a_backend_selects_it(tmp_path, args, env, backend) -> None:
    res = _check(tmp_path, *args, env=env)
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith(f"jobq-supervisor: configuration OK: backend {backend} ("), \
        res.stdout
    assert not (tmp_path / "jobq.db").exists()


def test_an_option_in_the_ini_file_selects_its_backend(tmp_path) -> None:
    ini = _ini(tmp_path, f"queue = fleet\npostgres-url = {PG_URL}\n")
    res = _check(tmp_path, "--config", str(ini))
    assert res.returncode == 0, res.stderr
    assert "backend postgres (PostgreSQL), queue fleet" in res.stdout


def test_the_shipped_worker_ini_keeps_working(tmp_path) -> None:
    """conf/worker.ini says ``backend = sqlite`` beside its ``sqlite-path``: still fine, also
    with another backend named above it (its ``sqlite-path`` is then overridden, as its
    ``backend``); a flag of another backend without ``--backend`` is refused, naming the
    file's line."""
    ini = REPO / "conf" / "worker.ini"
    db = tmp_path / "q.db"
    res = _check(tmp_path, "--config", str(ini), "--sqlite-path", str(db))
    assert res.returncode == 0, res.stderr
    assert f"backend sqlite ({db})" in res.stdout
    res = _check(tmp_path, "--config", str(ini), "--backend", "postgres", "--postgres-url",
                 PG_URL)
    assert res.returncode == 0, res.stderr
    assert "backend postgres (PostgreSQL)" in res.stdout
    res = _check(tmp_path, "--config", str(ini), env={"JOBQ_BACKEND": "servicebus",
                                                      "JOBQ_CONNECTION_STRING": SERVICEBUS})
    assert res.returncode == 0, res.stderr
    assert "backend servicebus (Service Bus)" in res.stdout
    res = _check(tmp_path, "--config", str(ini), "--postgres-url", PG_URL)
    one_usage_line(res, f"--postgres-url is a postgres option, but backend ({ini} line 22) "
                        "is sqlite")


@pytest.mark.parametrize("args, env, expected", [
    (["--sqlite-path", "x.db", "--backend", "postgres"], {},
     "--sqlite-path is a sqlite option, but --backend is postgres"),
    ([], {"JOBQ_BACKEND": "sqlite", "JOBQ_POSTGRES_URL": PG_URL},
     "JOBQ_POSTGRES_URL is a postgres option, but JOBQ_BACKEND is sqlite"),
    (["--postgres-notify", "off"], {"JOBQ_BACKEND": "storage-queue",
                                    "JOBQ_CONNECTION_STRING": STORAGE},
     "--postgres-notify is a postgres option, but JOBQ_BACKEND is storage-queue"),
    (["--backend", "servicebus", "--connection-string", STORAGE], {},
     "--connection-string is a storage-queue connection string, but --backend is servicebus"),
    ([], {"JOBQ_BACKEND": "postgres", "JOBQ_CONNECTION_STRING": SERVICEBUS},
     "JOBQ_CONNECTION_STRING is a servicebus connection string, but JOBQ_BACKEND is "
     "postgres"),
    (["--backend", "sqlite", "--connection-string", "Endpoint=x"], {},
     "--connection-string is an Azure (storage-queue or servicebus) option, but --backend "
     "is sqlite"),
    (["--sqlite-path", "x.db", "--postgres-url", PG_URL], {},
     "--sqlite-path is a sqlite option and --postgres-url a postgres option: give the "
     "options of one backend (and --backend)"),
    (["--namespace", "ns.servicebus.windows.net"], {"JOBQ_SQLITE_PATH": "x.db"},
     "JOBQ_SQLITE_PATH is a sqlite option and --namespace a servicebus option"),
    (["--connection-string", "Endpoint=https://x;SharedAccessSignature=s"], {},
     "--connection-string: cannot tell a Storage Queue connection string"),
])
def test_options_of_another_backend_are_exit_2_naming_both(tmp_path, args, env,
                                                           expected) -> None:
    for name in ("jobq-supervisor", "jobq-ctl"):
        res = run(name, *args, *(["size"] if name == "jobq-ctl" else []), cwd=tmp_path, env=env)
        line = one_usage_line(res, expected)
        assert line.startswith(f"{name}: error: "), line
    assert not (tmp_path / "jobq.db").exists() and not (tmp_path / "x.db").exists()


def test_ini_conflicts_name_the_file_and_lines(tmp_path) -> None:
    ini = _ini(tmp_path, "backend = sqlite\npostgres-url = postgresql://db/jobs\n")
    for name, cmd in (("jobq-supervisor", []), ("jobq-ctl", ["status"])):
        res = run(name, "--config", str(ini), *cmd, cwd=tmp_path)
        one_usage_line(res, f"postgres-url ({ini} line 3) is a postgres option, but backend "
                            f"({ini} line 2) is sqlite")
    # the file's --backend and an option of another backend in the environment: refused
    ini = _ini(tmp_path, "backend = postgres\n")
    res = run("jobq-ctl", "--config", str(ini), "size", cwd=tmp_path,
              env={"JOBQ_SQLITE_PATH": "q.db"})
    one_usage_line(res, f"JOBQ_SQLITE_PATH is a sqlite option, but backend ({ini} line 2) "
                        "is postgres")


def test_jobq_ctl_options_after_the_command_count_too(tmp_path) -> None:
    res = run("jobq-ctl", "--backend", "sqlite", "size", "--postgres-schema", "x",
              cwd=tmp_path)
    one_usage_line(res, "--postgres-schema is a postgres option, but --backend is sqlite")
    res = run("jobq-ctl", "size", "--sqlite-path", "x.db", "--backend", "postgres",
              cwd=tmp_path)
    one_usage_line(res, "--sqlite-path is a sqlite option, but --backend is postgres")
    assert not (tmp_path / "x.db").exists()


@pytest.mark.parametrize("text, backend", [
    (STORAGE, "storage-queue"),
    ("QueueEndpoint=https://a.queue.core.windows.net;SharedAccessSignature=sv=1", "storage-queue"),
    ("UseDevelopmentStorage=true", "storage-queue"),
    (SERVICEBUS, "servicebus"),
    ("Endpoint=sb://127.0.0.1:5672;SharedAccessKeyName=k;SharedAccessKey=v;"
     "UseDevelopmentEmulator=true", "servicebus"),
    ("Endpoint=sb://ns.servicebus.windows.net/;SharedAccessSignature=SharedAccessSignature "
     "sr=x", "servicebus"),
    ("Endpoint=https://x;SharedAccessSignature=s", None),
    ("AccountName=a;EntityPath=q", None),
])
def test_a_connection_string_says_its_service(text, backend) -> None:
    assert connection_string_backend(text) == backend
