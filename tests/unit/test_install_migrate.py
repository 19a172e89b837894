"""scripts/install_migrate.py: what an older install's unit set goes into worker.ini, its
relative paths become absolute, nothing else moves (the upgrade itself, for real, is
tests/integration/test_upgrade.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))

from install_migrate import main, migrate, option_keys, unit_environment  # noqa: E402

pytestmark = pytest.mark.timeout(60)

OLD_UNIT = """[Service]
ExecStart=/opt/jobq/bin/jobq-supervisor --config /etc/jobq/worker.ini
WorkingDirectory=/var/lib/jobq
Environment=JOBQ_SQLITE_PATH=/var/lib/jobq/jobq.db
Environment="JOBQ_LOG_LEVEL=DEBUG" JOBQ_NO_SUCH_OPTION=1 OTHER=2
"""
OLD_INI = """# comment: sqlite-path = jobq.db
[jobq-supervisor]
backend = sqlite
sqlite-path = jobq.db
# task-log-dir = logs
task-log-dir = logs
lock-file = /var/lib/jobq/batch.lock
num-workers = 2
"""


def test_an_old_units_variables_and_relative_paths_move_into_the_file() -> None:
    env, workdir = unit_environment(OLD_UNIT)
    assert env == {"JOBQ_SQLITE_PATH": "/var/lib/jobq/jobq.db", "JOBQ_LOG_LEVEL": "DEBUG",
                   "JOBQ_NO_SUCH_OPTION": "1"}
    assert workdir == "/var/lib/jobq"
    keys, paths = option_keys()
    assert {"sqlite-path", "task-log-dir", "lock-file"} <= paths and "log-level" in keys
    text, notes = migrate(OLD_INI, env, workdir, keys, paths)
    expected = (OLD_INI.replace("\nsqlite-path = jobq.db", "\nsqlite-path = /var/lib/jobq/jobq.db")
                .replace("\ntask-log-dir = logs", "\ntask-log-dir = /var/lib/jobq/logs"))
    assert text == expected + "log-level = DEBUG\n"
    assert notes == [
        "the old unit's JOBQ_NO_SUCH_OPTION is not an option of this release; dropped",
        "sqlite-path = jobq.db -> /var/lib/jobq/jobq.db (the old unit's JOBQ_SQLITE_PATH)",
        "task-log-dir = logs -> /var/lib/jobq/logs (relative to the old unit's working "
        "directory)",
        "log-level = DEBUG added (the old unit's JOBQ_LOG_LEVEL)"]


def test_a_unit_of_this_release_changes_nothing(tmp_path) -> None:
    unit = tmp_path / "jobq-supervisor.service"
    unit.write_text((REPO / "conf" / "jobq-supervisor.service").read_text())
    ini = tmp_path / "worker.ini"
    ini.write_text(OLD_INI)  # relative paths now mean the file's directory: left alone
    assert main(["--unit", str(unit), "--config", str(ini)]) == 0
    assert ini.read_text() == OLD_INI
    assert sorted(p.name for p in tmp_path.iterdir()) == ["jobq-supervisor.service",
                                                          "worker.ini"]


def test_the_file_is_rewritten_once_with_the_old_one_kept(tmp_path, capsys) -> None:
    unit = tmp_path / "jobq-supervisor.service"
    unit.write_text(OLD_UNIT)
    ini = tmp_path / "worker.ini"
    ini.write_text(OLD_INI)
    ini.chmod(0o640)
    assert main(["--unit", str(unit), "--config", str(ini)]) == 0
    kept = tmp_path / "worker.ini.before-upgrade"
    assert kept.read_text() == OLD_INI and (kept.stat().st_mode & 0o777) == 0o640
    assert (ini.stat().st_mode & 0o777) == 0o640
    assert "sqlite-path = /var/lib/jobq/jobq.db" in ini.read_text()
    out = capsys.readouterr().out
    assert f"install-service: {ini}: sqlite-path = jobq.db -> /var/lib/jobq/jobq.db" in out
    assert out.endswith(f"install-service: the file as it was: {kept}\n")
    migrated = ini.read_text()
    assert main(["--unit", str(unit), "--config", str(ini)]) == 0  # again: nothing to do
    assert ini.read_text() == migrated
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "jobq-supervisor.service", "worker.ini", "worker.ini.before-upgrade"]
