"""``jobq-supervisor --check-config`` (real processes): what scripts/install-service runs as the
service's user before a restart.  One line, exit 0 when a worker would start, 2 with the
reason when not; no queue is created; the flag is the command line's only."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.integration.test_config_file_and_queues import run

pytestmark = pytest.mark.timeout(120)


def _ini(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "etc" / "worker.ini"
    path.parent.mkdir(exist_ok=True)
    path.write_text("[jobq-supervisor]\n" + text)
    return path


def test_a_good_configuration_is_one_line_and_creates_no_queue(tmp_path) -> None:
    (tmp_path / "lib").mkdir()
    ini = _ini(tmp_path, f"sqlite-path = {tmp_path}/lib/jobq.db\nnum-workers = 3\n")
    res = run("jobq-supervisor", "--config", str(ini), "--check-config", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert res.stdout == (f"jobq-supervisor: configuration OK: backend sqlite "
                          f"({tmp_path}/lib/jobq.db), queue default, 3 slot(s)\n")
    assert res.stderr == ""
    assert not list((tmp_path / "lib").iterdir())


@pytest.mark.parametrize("text, reason", [
    ("sqlite-path = jobq.db\nnum-workers = 0\n", "line 3: num-workers:"),
    ("sqlite-path = jobq.db\nmax-atempts = 3\n", "unknown key 'max-atempts'"),
    ("sqlite-path = nowhere/jobq.db\n", "the directory of "),
])
def test_a_refused_configuration_is_exit_2_and_one_line(tmp_path, text, reason) -> None:
    res = run("jobq-supervisor", "--config", str(_ini(tmp_path, text)), "--check-config",
              cwd=tmp_path)
    assert res.returncode == 2, res
    assert res.stdout == ""
    assert res.stderr.count("\n") == 1 and reason in res.stderr, res.stderr
    assert "Traceback" not in res.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to become another user")
def test_a_queue_the_user_cannot_write_is_refused(tmp_path) -> None:
    """As the service's user would see it (a forked child that became nobody: the test venv's
    interpreter may live where nobody can run it)."""
    import pwd
    import tempfile

    from supervisor.worker.config_check import sqlite_problem

    def as_nobody(*paths: Path) -> list[str | None]:
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover (the child)
            try:
                nobody = pwd.getpwnam("nobody")
                os.setgid(nobody.pw_gid)
                os.setuid(nobody.pw_uid)
                os.write(write, repr([sqlite_problem(str(p)) for p in paths]).encode())
            finally:
                os._exit(0)
        os.close(write)
        with os.fdopen(read) as f:
            answers = f.read()
        os.waitpid(pid, 0)
        return eval(answers)  # noqa: S307 (our own child's repr of strings and None)

    # pytest's base temp is root's own (0700): a queue below it cannot even be reached
    assert as_nobody(tmp_path / "jobq.db")[0].endswith(
        "cannot be reached by this user (uid 65534): a directory above it is closed")
    with tempfile.TemporaryDirectory(prefix="jobq-check-") as top:
        lib = Path(top)
        os.chmod(lib, 0o755)
        (lib / "jobq.db").write_bytes(b"")
        os.chmod(lib / "jobq.db", 0o666)  # the file may be written, its directory not
        closed = f"--sqlite-path: {lib} cannot be written by this user (uid 65534)"
        answers = as_nobody(lib / "jobq.db", lib / "other.db")
        assert all(a is not None and a.startswith(closed) for a in answers), answers
        os.chmod(lib, 0o777)
        assert as_nobody(lib / "jobq.db", lib / "other.db") == [None, None]


def test_the_flag_is_not_a_key_of_the_file(tmp_path) -> None:
    ini = _ini(tmp_path, "check-config = true\n")
    res = run("jobq-supervisor", "--config", str(ini), cwd=tmp_path)
    assert res.returncode == 2
    assert "unknown key 'check-config'" in res.stderr


def test_the_flag_abbreviated_checks_and_its_variable_does_nothing(tmp_path) -> None:
    """Read from the parsed options, not looked for in argv: ``--check-c`` checks too (an
    abbreviation argparse takes), and JOBQ_CHECK_CONFIG is no way to give it (a worker
    started with it runs as any other, and makes its queue)."""
    (tmp_path / "lib").mkdir()
    ini = _ini(tmp_path, f"sqlite-path = {tmp_path}/lib/jobq.db\n")
    res = run("jobq-supervisor", "--config", str(ini), "--check-c", cwd=tmp_path)
    assert (res.returncode, res.stdout.startswith("jobq-supervisor: configuration OK")) == (
        0, True), res
    assert not (tmp_path / "lib" / "jobq.db").exists()
    res = run("jobq-supervisor", "--config", str(ini), "--exit-when-empty", cwd=tmp_path,
              env={"JOBQ_CHECK_CONFIG": "true"})
    assert res.returncode == 0 and "configuration OK" not in res.stdout, res
    assert "summary:" in res.stderr and (tmp_path / "lib" / "jobq.db").exists(), res
    help_text = run("jobq-supervisor", "--help", cwd=tmp_path).stdout
    assert "JOBQ_CHECK_CONFIG" not in help_text
