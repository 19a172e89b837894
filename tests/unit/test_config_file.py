"""Issue 25: every path option of both commands is resolved against the config file's
directory (the mechanism is one marker, so a new path option must carry it), and the shipped
files name one queue for the service, cron, jobq-ctl and the scripts of the README and docs/."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from supervisor.core.config_file import CONFIG_ATTR, PATH_ATTR
from supervisor.ctl.main import ctl_parser
from supervisor.worker.main import parse_worker_settings, worker_parser

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("parser", [worker_parser(), ctl_parser()], ids=lambda p: p.prog)
def test_every_path_option_is_resolved_against_the_config_file(parser):
    """An option that names a file or directory (by its name or metavar) is marked
    ``path=True``; nothing else is.  Sub-command options (push --file, dashboard
    --token-file) are flags only: never read from the file."""
    for action in parser._actions:
        if getattr(action, CONFIG_ATTR, False) or not action.option_strings:
            continue
        names_a_path = action.metavar in ("PATH", "DIR") or action.dest.endswith(
            ("_path", "_file", "_dir"))
        assert getattr(action, PATH_ATTR, False) is names_a_path, action.dest


def test_the_shipped_files_point_every_command_at_one_queue(tmp_path, monkeypatch):
    for name in [k for k in os.environ if k.startswith("JOBQ_")]:
        monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)  # wherever a command starts
    unit = (REPO / "conf" / "jobq-supervisor.service").read_text()
    cron = (REPO / "conf" / "cron.example").read_text()
    readme = "\n".join(p.read_text() for p in [REPO / "README.rst",
                                                *sorted((REPO / "docs").glob("*.rst"))])
    install = (REPO / "scripts" / "install-service").read_text()
    installed = re.search(r"^ExecStart=\S+ --config (\S+)$", unit, re.M).group(1)
    state = "/var/lib/" + re.search(r"^StateDirectory=(\S+)$", unit, re.M).group(1)
    # the queue is the INI file's, which jobq-ctl reads too: no environment of the unit's
    assert not re.search(r"^Environment=.*JOBQ_SQLITE_PATH", unit, re.M)
    settings = parse_worker_settings(["--config", str(REPO / "conf" / "worker.ini")])
    assert settings.sqlite_path == f"{state}/jobq.db"
    assert f"install -m 0644 conf/worker.ini {installed}" in install
    assert f"--config {installed} " in cron and f"--lock-file {state}/" in cron
    used = set(re.findall(r"jobq-(?:ctl|supervisor) --config ([^\s`]+)", readme))
    assert used == {installed}, used
