"""Issue 39 (4) replayed: secrets on disk and in ``ps``.

Another local user (a real unprivileged one: ``setpriv`` to nobody, 65534) read a task's API
key from the SQLite queue, another task's output from the output store and the task logs, and
the PostgreSQL password from the worker's command line; a task saw ``DATABASE_URL``-style
secrets in its environment and the dashboard showed them.  The queue lives in a directory
every user may enter (as /srv/jobq would be), so only the modes of what jobq creates stand in
the way.  Needs root, as the suite runs.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from supervisor.dashboard.app import create_app
from tests.conftest import Env, wait_for
from tests.dashboard.conftest import data_source

pytestmark = [pytest.mark.timeout(60),
              pytest.mark.skipif(os.geteuid() != 0, reason="needs root to become nobody")]

SECRET = "s3cr3t-0f-an0ther-task"
NOBODY = ("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups")


def as_nobody(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([*NOBODY, *argv], capture_output=True, text=True, timeout=20)


@pytest.fixture
def shared() -> Iterator[Env]:
    """A queue in a directory every local user may enter and list (0755)."""
    path = Path(tempfile.mkdtemp(prefix="jobq-attack-"))
    path.chmod(0o755)
    env = Env(path)
    try:
        yield env
    finally:
        env.cleanup()
        shutil.rmtree(path)


def test_another_user_cannot_read_the_queue_the_output_or_the_task_logs(shared):
    shared.push(f"echo output-{SECRET}", extra=("--env", f"OTHER_API_KEY={SECRET}"))
    sup = shared.supervisor("--exit-when-empty", "--task-log-dir", "logs",
                            prefix=("/bin/sh", "-c", 'umask 0022 && exec "$@"', "sh"))
    assert sup.wait(30) == 0, sup.log()
    [log] = (shared.tmp / "logs").iterdir()
    [stored] = Path(f"{shared.db}.output").glob("*/*/1.log")
    assert SECRET in shared.db.read_bytes().decode("latin-1") and SECRET in log.read_text()
    for path in (shared.db, log, stored):
        res = as_nobody("cat", str(path))
        assert res.returncode != 0 and "Permission denied" in res.stderr, path
        assert SECRET not in res.stdout
    for directory in (shared.tmp / "logs", Path(f"{shared.db}.output")):
        assert as_nobody("ls", str(directory)).returncode != 0, directory
    res = as_nobody("python3", "-c", f"import sqlite3; print(sqlite3.connect('{shared.db}')"
                                     ".execute('SELECT * FROM jobs').fetchall())")
    assert res.returncode != 0 and SECRET not in res.stdout


def test_another_user_does_not_see_the_postgres_password_in_ps(shared):
    password = f"pg-{SECRET}"
    with socket.socket() as silent:  # accepts, never answers: the worker waits in start-up
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        url = f"postgresql://jobq:{password}@127.0.0.1:{silent.getsockname()[1]}/q"
        sup = shared.supervisor("--backend", "postgres", "--postgres-url", url, base=False)

        def seen_by_nobody() -> str:
            res = as_nobody("ps", "-ww", "-o", "args=", "-p", str(sup.pid))
            return res.stdout if "--postgres-url" in res.stdout else ""

        wait_for(lambda: password not in seen_by_nobody(), 20, what="password gone from ps")
        res = as_nobody("cat", f"/proc/{sup.pid}/cmdline")
        assert "--postgres-url" in res.stdout and password not in res.stdout


LEAKS = {
    "DATABASE_URL": f"postgres://app:{SECRET}@db.example:5432/app",
    "HTTPS_PROXY": f"http://user:{SECRET}@proxy.example:3128",
    "SENTRY_DSN": f"https://{SECRET}0123456789@o1.ingest.sentry.io/42",
    "IDENTITY_HEADER": SECRET,
    "STORAGE_CONN": f"AccountName=acct;AccountKey={SECRET};EndpointSuffix=core.windows.net",
}


def test_a_task_does_not_see_the_workers_secrets_by_value(env):
    out = env.tmp / "env.txt"
    env.push(f"env > {out}")
    sup = env.supervisor("--exit-when-empty", env={**LEAKS, "HARMLESS": "visible"})
    assert sup.wait(30) == 0, sup.log()
    text = out.read_text()
    assert SECRET not in text and "HARMLESS=visible" in text


def test_the_dashboard_masks_secrets_by_value(env):
    (task_id,) = env.push("true", extra=tuple(
        arg for name, value in LEAKS.items() for arg in ("--env", f"{name}={value}")))
    client = create_app(data_source(env)).test_client()
    html = client.get(f"/tasks/{task_id}").get_data(as_text=True)
    api = client.get(f"/api/task/{task_id}").get_json()
    assert SECRET not in html and SECRET not in str(api)
    assert api["env"] == {name: "********" for name in LEAKS}
