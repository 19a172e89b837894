"""Issue 40 (1), acceptance: an upgrade from an older release's real install keeps the service
running on the same queue.

In the tests' private systemd manager (tests/systemd_manager.py: its own /etc, /var and /opt,
its unit directory is /etc/systemd/system in there), the install of commit OLD (2026-11-24) is
made by that commit's own ``scripts/install-service``: its unit set
``JOBQ_SQLITE_PATH=/var/lib/jobq/jobq.db``, its worker.ini says ``sqlite-path = jobq.db``.
The service runs there with a task in every state.  Then the documented upgrade: today's
``scripts/install-service``, ``systemctl restart jobq-supervisor``.  The service runs the new
build on the same queue (the succeeded and failed tasks are there, the running one ran on
uncounted), and ``jobq-ctl --config /etc/jobq/worker.ini`` reaches it from anywhere.

Both installs are offline: the venv gets the locked packages from uv's cache first (what an
older install had installed; the cache is the one scripts/venv filled, seen through an
overlay so that nothing is written to it), and pip finds every requirement satisfied.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from supervisor import __version__
from tests.conftest import wait_for
from tests.systemd_manager import SystemdManager, running_manager

pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
OLD = "105b74bf8d13e7332a1b4df7b4892fbf3bc01338"  # main of 2026-11-24
UNIT = "jobq-supervisor.service"
# The service must not look for Azure's metadata endpoint from a test, whatever the machine.
SECRETS = "JOBQ_SCHEDULED_EVENTS=off\nJOBQ_DISABLE_SCHEDULED_EVENTS=1\n"


def _checkout(rev: str | None, to: Path) -> Path:
    """The tracked files of ``rev`` (None: of the working tree, as they are) in ``to``."""
    to.mkdir()
    if rev is None:
        files = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, check=True,
                               capture_output=True).stdout.split(b"\0")
        for name in filter(None, files):
            src = REPO / name.decode()
            if src.is_file():
                (to / name.decode()).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, to / name.decode())
        return to
    archive = subprocess.run(["git", "archive", rev], cwd=REPO, check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(to)], input=archive, check=True)
    return to


def _sh(manager: SystemdManager, script: str, timeout: float = 180) -> str:
    """``script`` as root in the manager's namespaces; its output, or the test fails."""
    res = subprocess.run([*manager.enter(), "/bin/bash", "-euo", "pipefail", "-c", script],
                         capture_output=True, text=True, timeout=timeout)
    assert res.returncode == 0, f"{script}\n-> {res.returncode}\n{res.stdout}\n{res.stderr}"
    return res.stdout + res.stderr


def _uv_cache() -> str:
    uv = Path(sys.prefix) / "bin" / "uv"
    if not uv.exists():
        pytest.skip("no uv in the test venv (scripts/venv installs it)")
    return subprocess.run([str(uv), "cache", "dir"], capture_output=True, text=True,
                          check=True).stdout.strip()


@pytest.fixture
def manager(tmp_path_factory):
    with running_manager(tmp_path_factory) as m:
        yield m


def _ctl(manager: SystemdManager, *args: str) -> str:
    """The installed jobq-ctl, as the service's user, from / (not the queue's directory)."""
    quoted = " ".join(f"'{a}'" for a in args)
    return _sh(manager, f"cd / && setpriv --reuid=jobq --regid=jobq --init-groups -- "
                        f"/opt/jobq/bin/jobq-ctl {quoted}", timeout=60)


def _states(manager: SystemdManager) -> dict[str, str]:
    """Task id -> ``status/attempt`` in the service's queue (read-only)."""
    rows = _sh(manager, "python3 - <<'EOF'\nimport sqlite3\n"
                        "c = sqlite3.connect('file:/var/lib/jobq/jobq.db?mode=ro', uri=True)\n"
                        "for row in c.execute('SELECT id, status, attempt FROM jobs'):\n"
                        "    print('|'.join(map(str, row)))\nEOF")
    return {tid: f"{status}/{attempt}" for tid, status, attempt in
            (line.split("|") for line in rows.splitlines() if line.count("|") == 2)}


def _active(manager: SystemdManager) -> str:
    return manager.systemctl("is-active", UNIT).stdout.strip()


def test_an_old_install_upgraded_as_documented_serves_the_same_queue(manager, tmp_path):
    old = _checkout(OLD, tmp_path / "old")
    new = _checkout(None, tmp_path / "new")
    # The copy's commit, as a checkout names it (a detached HEAD): the new build shows it.
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, check=True,
                          capture_output=True, text=True).stdout.strip()
    (new / ".git").mkdir()
    (new / ".git" / "HEAD").write_text(head + "\n")
    cache = _uv_cache()
    uv = Path(sys.prefix) / "bin" / "uv"
    work = tmp_path / "uv-overlay"
    (work / "upper").mkdir(parents=True)
    (work / "work").mkdir()
    # What an older install had in its venv: the locked packages (offline, from uv's cache).
    _sh(manager, f"""
        /usr/bin/python3 -m venv /opt/jobq
        unshare --mount /bin/bash -euc '
            mount -t overlay jobq-uv -o lowerdir={cache},upperdir={work}/upper \
                -o workdir={work}/work {cache}
            {uv} pip install --quiet --offline --python /opt/jobq/bin/python \
                --require-hashes -r {new}/conf/lock/base.txt'
        """)
    offline = "export PIP_NO_INDEX=1 PIP_NO_BUILD_ISOLATION=0 PATH=/usr/sbin:/usr/bin:/sbin:/bin"
    out = _sh(manager, f"{offline}; cd {old} && scripts/install-service")
    assert "installed" in out
    assert "Environment=JOBQ_SQLITE_PATH=/var/lib/jobq/jobq.db" in _sh(
        manager, f"cat /etc/systemd/system/{UNIT}")
    _sh(manager, f"printf '{SECRETS}' > /etc/jobq/secrets.env && "
                 "sed -i 's/^num-workers = 1$/num-workers = 2/' /etc/jobq/worker.ini")
    assert manager.systemctl("start", UNIT).returncode == 0, _sh(
        manager, f"journalctl -u {UNIT} --no-pager | tail -20 || true")
    assert _active(manager) == "active"

    # A task in every state, on the old build: succeeded, failed, running, pending.
    push = ("push", "--sqlite-path", "/var/lib/jobq/jobq.db")
    ok = _ctl(manager, *push, "-c", "echo ok").split()[-1]
    bad = _ctl(manager, *push, "--max-attempts", "1", "-c", "exit 3").split()[-1]
    wait_for(lambda: _states(manager).get(ok) == "succeeded/1"
             and _states(manager).get(bad, "").startswith("failed"), 60,
             what="the old service ran the first two tasks")
    long1 = _ctl(manager, *push, "-c", "sleep 600").split()[-1]
    long2 = _ctl(manager, *push, "-c", "sleep 601").split()[-1]
    waiting = _ctl(manager, *push, "-c", "echo pending").split()[-1]
    wait_for(lambda: _states(manager).get(long1) == "running/1"
             and _states(manager).get(long2) == "running/1", 60, what="two long tasks running")
    assert _states(manager)[waiting] == "pending/0"

    # The documented upgrade: today's install-service, then a restart.
    out = _sh(manager, f"{offline}; cd {new} && PATH={Path(sys.executable).parent}:$PATH "
                       "scripts/install-service")
    ours = subprocess.run([*manager.enter(), "setpriv", "--reuid=jobq", "--regid=jobq",
                           "--init-groups", "--", sys.executable, "-c", ""],
                          capture_output=True).returncode == 0
    if not ours:  # e.g. a pyenv under /root: the venv must come from the system's Python
        assert f"user jobq cannot run {Path(sys.executable).resolve()}; using /usr/bin/python3" \
            in out, out
    assert ("/etc/jobq/worker.ini: sqlite-path = jobq.db -> /var/lib/jobq/jobq.db (the old "
            "unit's JOBQ_SQLITE_PATH)") in out, out
    assert "configuration OK: backend sqlite (/var/lib/jobq/jobq.db)" in out, out
    assert "upgraded; to run the new build: systemctl restart jobq-supervisor" in out, out
    assert _active(manager) == "active"  # the install disturbed nothing
    assert _sh(manager, "cat /etc/jobq/worker.ini.before-upgrade").count(
        "sqlite-path = jobq.db") == 1
    assert "Environment=JOBQ_" not in _sh(manager, f"cat /etc/systemd/system/{UNIT}")
    assert manager.systemctl("restart", UNIT).returncode == 0
    assert _active(manager) == "active"

    # The same queue, the new build: the long tasks run again with no attempt counted, the
    # pending one still waits for a slot, and jobq-ctl --config reaches the queue from
    # anywhere: a cancel frees a slot for it, a task pushed runs.
    wait_for(lambda: _states(manager).get(long1) == "running/1"
             and _states(manager).get(long2) == "running/1", 60,
             what="the long tasks running again, uncounted")
    states = _states(manager)
    assert states[ok] == "succeeded/1" and states[bad].startswith("failed"), states
    assert states[waiting] == "pending/0", states
    ctl = ("--config", "/etc/jobq/worker.ini")
    status = json.loads(_ctl(manager, *ctl, "status", "--json"))
    counts = status["counts"]
    assert (counts["running"], counts["pending"], counts["succeeded"]) == (2, 1, 1), status
    _ctl(manager, *ctl, "cancel", long1)
    wait_for(lambda: _states(manager).get(waiting) == "succeeded/1", 60,
             what="the pending task ran on the new build")
    after = _ctl(manager, *ctl, "push", "-c", "echo after-upgrade").split()[-1]
    wait_for(lambda: _states(manager).get(after) == "succeeded/1", 60,
             what="a task pushed with --config after the upgrade")
    [worker] = [w for w in json.loads(_ctl(manager, *ctl, "workers", "--json"))
                if w["state"] == "running"]
    assert worker["version"] == f"{__version__}+g{head[:12]}", worker
    assert "No such file" in subprocess.run(
        [*manager.enter(), "ls", "/etc/jobq/jobq.db"], capture_output=True, text=True).stderr
    assert _active(manager) == "active"
