"""A real, private systemd system manager for tests of the systemd scope path and the unit.

Boots ``/usr/bin/systemd --system`` as PID 1 of new PID, mount, UTS and cgroup namespaces.  It
sees only what a test gives it, because a manager that could load the host's units once ran the
host's ``sysinit.target`` (tmpfiles, udev, sysusers) for a unit with default dependencies and
emptied the host's /tmp:

* units: only ``units`` (``SYSTEMD_UNIT_PATH`` without the trailing colon that would add the
  default paths), holding its own empty default target and empty stand-ins for the targets a
  service's default dependencies name (``STUB_UNITS``); no generators;
* a private tmpfs on /run, and one on /tmp showing only ``shared`` host directories (the test's
  base temp, this checkout, the interpreter);
* /var, /etc and /opt as overlays: the host's files, but every write or removal stays
  private; the unit directory is also /etc/systemd/system in there (what an installer puts
  there is a unit of this manager).

Its cgroups live in a fresh sub-cgroup of ours in every
mounted hierarchy, remounted inside the namespace so that systemd sees them as its root; the
host's /run, /sys and cgroup roots are never written.  /proc/sys is read-only in there and
/dev/console is /dev/null, so PID 1's set-up cannot touch host settings or the console.

Processes that must talk to it (``systemd-run`` sends its own pid, which only means something
in the manager's PID namespace) run under ``manager.enter()``: nsenter into its mount, PID and
cgroup namespaces.  ``stop()`` SIGKILLs that PID 1 by pid (the kernel then kills everything in
its namespace), waits for the launcher and removes the cgroups it left.

Needs root, util-linux unshare/nsenter and systemd; ``start`` raises ``Unavailable`` (the
fixture skips with the reason) where one of them is missing or the manager does not come up.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import psutil

SYSTEMD = "/usr/bin/systemd"
START_TIMEOUT = 20.0
_TARGET = "[Unit]\nDescription=jobq test stub\n"
# What the manager can load: its default target and empty stand-ins for the units a service's
# default dependencies name, so that a unit with DefaultDependencies=yes (the shipped one)
# starts without pulling in the host's sysinit.target (tmpfiles, udev, sysusers).
STUB_UNITS = {name: _TARGET for name in (
    "jobq-test.target", "sysinit.target", "basic.target", "shutdown.target",
    "network-online.target", "multi-user.target")}

_INNER = r"""
set -e
units=$2
mount --make-rprivate /
mount -t tmpfs -o mode=755 jobq-test-run /run
mkdir -p /run/systemd/system /run/jobq-test/empty /run/jobq-test/host-tmp
# A private /tmp that shows only the host paths named in $3 (the tests' own directories).
mapfile -t shared < "$3"
mount --bind /tmp /run/jobq-test/host-tmp
mount -t tmpfs -o mode=1777 jobq-test-tmp /tmp
for path in "${shared[@]}"; do
    mkdir -p "$path"
    mount --bind "/run/jobq-test/host-tmp/${path#/tmp/}" "$path"
done
umount -l /run/jobq-test/host-tmp
# /var, /etc and /opt as the host has them, but every write or removal stays in here (an
# install: a venv in /opt, a user, /etc/jobq).
for dir in var etc opt; do
    mkdir -p "/run/jobq-test/$dir/upper" "/run/jobq-test/$dir/work"
    mount -t overlay "jobq-test-$dir" \
        -o "lowerdir=/$dir,upperdir=/run/jobq-test/$dir/upper,workdir=/run/jobq-test/$dir/work" \
        "/$dir"
done
# What an installer writes to /etc/systemd/system lands in the manager's unit directory.
mkdir -p /etc/systemd/system
mount --bind "$units" /etc/systemd/system
mount --bind /proc/sys /proc/sys
mount -o remount,bind,ro /proc/sys
mount --bind /dev/null /dev/console 2>/dev/null || true
mount -t tmpfs -o mode=755 jobq-test-cgroup /sys/fs/cgroup
while read -r dir fstype opts; do
    mkdir -p "/sys/fs/cgroup/$dir"
    mount -t "$fstype" -o "$opts" "$fstype" "/sys/fs/cgroup/$dir"
done < "$1"
# Only the units in $units (no trailing colon: none of the host's), no generators.
exec env -i container=jobq-test PATH=/usr/sbin:/usr/bin:/sbin:/bin \
    SYSTEMD_UNIT_PATH="$units" SYSTEMD_GENERATOR_PATH=/run/jobq-test/empty \
    SYSTEMD_ENVIRONMENT_GENERATOR_PATH=/run/jobq-test/empty \
    /usr/bin/systemd --system --unit=jobq-test.target --log-target=null --show-status=no
"""


class Unavailable(Exception):
    """No private systemd manager here; the message says why."""


@dataclass
class Hierarchy:
    subdir: str  # below /sys/fs/cgroup ("" for a cgroup2 mounted there itself)
    fstype: str  # cgroup or cgroup2
    options: str  # mount options that recreate it (controllers, name=)
    ours: Path  # our own cgroup directory in it, on the host


@dataclass
class SystemdManager:
    workdir: Path
    name: str = field(default_factory=lambda: f"jobq-test-{uuid.uuid4().hex[:10]}")
    launcher: subprocess.Popen | None = None
    pid: int = 0  # the manager's pid in the host's PID namespace
    cgroups: list[Path] = field(default_factory=list)
    # Host directories under /tmp the manager's processes must see (the manager's /tmp is
    # private); the workdir, this checkout and the interpreter's are always added.
    shared: tuple[Path, ...] = ()

    @property
    def units(self) -> Path:
        """The manager's only unit directory (a host path): add a unit, then daemon-reload."""
        return self.workdir / f"{self.name}.units"

    def enter(self) -> list[str]:
        """argv prefix that runs a command in the manager's namespaces."""
        return ["nsenter", f"--target={self.pid}", "--mount", "--pid", "--cgroup", "--"]

    def run(self, *argv: str) -> subprocess.CompletedProcess:
        """Run a command in the manager's namespaces (its /run, /tmp, /var and /etc)."""
        return subprocess.run([*self.enter(), *argv], capture_output=True, text=True,
                              timeout=20)

    def systemctl(self, *args: str) -> subprocess.CompletedProcess:
        return self.run("systemctl", *args)

    # -- life cycle ------------------------------------------------------------------------
    def start(self) -> None:
        if os.geteuid() != 0:
            raise Unavailable("needs root (a system manager in private namespaces)")
        for tool in (SYSTEMD, "unshare", "nsenter", "systemd-run", "systemctl"):
            if shutil.which(tool) is None:
                raise Unavailable(f"{tool} is not installed")
        hierarchies = _hierarchies()
        if not hierarchies:
            raise Unavailable("no cgroup hierarchy mounted under /sys/fs/cgroup")
        spec = self.workdir / f"{self.name}.mounts"
        lines = []
        try:
            for h in hierarchies:
                path = h.ours / self.name
                path.mkdir()
                self.cgroups.append(path)
                if (h.ours / "cpuset.cpus").exists():  # v1 cpuset: a child starts empty
                    for knob in ("cpuset.cpus", "cpuset.mems"):
                        (path / knob).write_text((h.ours / knob).read_text())
                lines.append(f"{h.subdir or '.'} {h.fstype} {h.options}")
        except OSError as exc:
            self.stop()
            raise Unavailable(f"cannot create a cgroup for the manager: {exc}") from None
        spec.write_text("\n".join(lines) + "\n")
        self.units.mkdir()
        for name, text in STUB_UNITS.items():
            (self.units / name).write_text(text)
        shared = self.workdir / f"{self.name}.shared"
        shared.write_text("".join(f"{p}\n" for p in _under_tmp(
            [self.workdir, *self.shared, Path(__file__).resolve().parents[1],
             Path(sys.prefix).resolve(), Path(sys.base_prefix).resolve()])))
        inner = self.workdir / f"{self.name}.sh"
        inner.write_text(_INNER)
        # The launcher joins the new cgroups itself, then becomes unshare; PID 1 inherits them.
        joins = " ".join(f"echo $$ > {p / 'cgroup.procs'};" for p in self.cgroups)
        outer = (f"{joins} exec unshare --pid --fork --mount --uts --cgroup --mount-proc "
                 f"--propagation private /bin/bash {inner} {spec} {self.units} {shared}")
        log = open(self.workdir / f"{self.name}.log", "wb")
        self.launcher = subprocess.Popen(["/bin/bash", "-c", outer], stdin=subprocess.DEVNULL,
                                         stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True)
        log.close()
        try:
            self._wait_running()
        except Unavailable:
            self.stop()
            raise

    def _wait_running(self) -> None:
        assert self.launcher is not None
        deadline = time.monotonic() + START_TIMEOUT
        state = ""
        while time.monotonic() < deadline:
            if self.launcher.poll() is not None:
                text = (self.workdir / f"{self.name}.log").read_text(errors="replace")
                raise Unavailable(f"the manager exited at start: {text.strip()[-500:]}")
            if not self.pid:
                self.pid = _systemd_below(self.launcher.pid)
            if self.pid:
                state = self.systemctl("is-system-running").stdout.strip()
                if state in ("running", "degraded"):
                    return
            time.sleep(0.1)
        raise Unavailable(f"the manager did not come up within {START_TIMEOUT:g}s "
                          f"(state {state or 'unknown'})")

    def stop(self) -> None:
        if not self.pid and self.launcher is not None:
            self.pid = _systemd_below(self.launcher.pid)
        if self.pid:
            try:
                os.kill(self.pid, signal.SIGKILL)  # PID 1 of its namespace: all go with it
            except ProcessLookupError:
                pass
        if self.launcher is not None:
            try:
                self.launcher.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.launcher.pid, signal.SIGKILL)
                self.launcher.wait(10)
        deadline = time.monotonic() + 10
        for top in self.cgroups:
            while top.exists():
                try:
                    for d in sorted((p for p in top.rglob("*") if p.is_dir()),
                                    key=lambda p: len(p.parts), reverse=True):
                        d.rmdir()
                    top.rmdir()
                except OSError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.05)
        self.cgroups.clear()


@contextmanager
def running_manager(tmp_path_factory, *shared: Path) -> Iterator[SystemdManager]:
    """A started manager that sees the test session's base temp (and ``shared``), stopped at
    the end; a pytest skip with the reason where none can start (a fixture's body)."""
    import pytest

    m = SystemdManager(tmp_path_factory.mktemp("systemd"),
                       shared=(tmp_path_factory.getbasetemp(), *shared))
    try:
        m.start()
    except Unavailable as exc:
        pytest.skip(f"no private systemd manager: {exc}")
    try:
        yield m
    finally:
        m.stop()


def _under_tmp(paths: list[Path]) -> list[str]:
    """The paths below /tmp, outermost first, none inside another."""
    out: list[str] = []
    for path in sorted({str(p.resolve()) for p in paths}, key=len):
        if path.startswith("/tmp/") and not any(path.startswith(o + "/") for o in out):
            out.append(path)
    return out


def _systemd_below(pid: int) -> int:
    """The pid of the systemd process under the launcher (unshare forks it), or 0."""
    try:
        for child in psutil.Process(pid).children(recursive=True):
            if child.exe() == os.path.realpath(SYSTEMD):
                return child.pid
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        pass
    return 0


def _hierarchies() -> list[Hierarchy]:
    """Every cgroup mount under /sys/fs/cgroup and our cgroup in it (from /proc/self)."""
    ours: dict[str, str] = {}
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        for c in (controllers.split(",") if controllers else [""]):
            ours[c] = path
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, right = line.split(" - ", 1)
        fields = left.split()
        root, mountpoint = fields[3], fields[4]
        fstype, _source, super_opts = right.split()[:3]
        if fstype not in ("cgroup", "cgroup2") or not mountpoint.startswith("/sys/fs/cgroup"):
            continue
        if fstype == "cgroup2":
            key, options = "", "nsdelegate" if "nsdelegate" in super_opts else "rw"
        else:
            names = [o for o in super_opts.split(",") if o not in ("rw", "ro")
                     and not o.startswith(("release_agent", "clone_children"))]
            key = next((o for o in names if o.startswith("name=")), names[0] if names else "")
            options = ",".join(names) if not key.startswith("name=") else f"none,{key}"
        path = ours.get(key)
        if path is None or not path.startswith(root):
            continue
        rel = path[len(root):].lstrip("/") if root != "/" else path.lstrip("/")
        subdir = mountpoint[len("/sys/fs/cgroup"):].lstrip("/")
        found.append(Hierarchy(subdir=subdir, fstype=fstype, options=options,
                               ours=Path(mountpoint) / rel))
    return found
