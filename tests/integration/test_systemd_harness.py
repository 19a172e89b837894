"""The private systemd manager of the tests (tests/systemd_manager.py) leaves the host alone.

Started with the shipped unit, whose default dependencies name ``sysinit.target``, a manager
that could load the host's units once ran the host's ``systemd-tmpfiles-setup`` and emptied the
host's /tmp.  Here the shipped unit is started for real; a canary file in the host's /tmp must
survive, and no service but the shipped one may even be loaded.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from tests.conftest import wait_for
from tests.systemd_manager import STUB_UNITS, running_manager

pytestmark = pytest.mark.timeout(90)

UNIT = Path(__file__).resolve().parents[2] / "conf" / "jobq-supervisor.service"


@pytest.fixture
def manager(tmp_path_factory):
    with running_manager(tmp_path_factory) as m:
        yield m


def loaded(manager, kind: str) -> set[str]:
    """Units of that kind the manager loaded from a file (a unit only named is "not-found")."""
    out = manager.systemctl("list-units", "--all", "--plain", "--no-legend",
                            f"--type={kind}").stdout
    return {fields[0] for fields in map(str.split, out.splitlines())
            if len(fields) > 1 and fields[1] == "loaded"}


def state(manager, unit: str) -> dict[str, str]:
    out = manager.systemctl("show", "--property=ActiveState,Result", unit).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def test_the_shipped_unit_starts_nothing_of_the_hosts(manager):
    canary = Path("/tmp") / f"jobq-canary-{uuid.uuid4().hex}"
    canary.write_text("host file\n")
    try:
        (manager.units / UNIT.name).write_text(UNIT.read_text())
        assert manager.systemctl("daemon-reload").returncode == 0
        res = manager.systemctl("start", "--no-block", UNIT.name)
        assert res.returncode == 0, res.stderr
        # No install here (no /opt/jobq, no user jobq): the start fails, but only after the
        # manager resolved and ran the unit's dependencies, which is what could hurt.
        wait_for(lambda: state(manager, UNIT.name).get("Result", "success") != "success"
                 or state(manager, UNIT.name).get("ActiveState") == "active", 30,
                 what="the unit's first start over")
        assert canary.read_text() == "host file\n"
        assert loaded(manager, "service") == {UNIT.name}
        assert loaded(manager, "target") <= set(STUB_UNITS)
        assert not loaded(manager, "socket") and not loaded(manager, "timer")
        # Its /tmp is its own: a file made in there is not the host's, and the reverse.
        assert manager.run("test", "-e", str(canary)).returncode == 1
        mine = Path("/tmp") / f"jobq-inside-{canary.name}"
        assert manager.run("touch", str(mine)).returncode == 0
        assert manager.run("test", "-e", str(mine)).returncode == 0
        assert not mine.exists()
        # /etc and /var: the host's, but a change in there stays in there.
        assert manager.run("rm", "/etc/hostname").returncode == 0
        assert Path("/etc/hostname").exists()
    finally:
        canary.unlink(missing_ok=True)
