"""What every benchmark figure shares: waiting, supervisors that always stop, logs, Azurite.

Used by ``scripts/bench.py`` and the figure modules it lists.  Everything here runs on the
bench's main thread.  A wait that times out raises: a figure either has its number or the
bench stops with the reason, never a number measured from a timeout.
"""

from __future__ import annotations

import calendar
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import psutil

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


def byte_compile() -> None:
    """Byte-compile the package, as pip does at install: an editable checkout run with
    PYTHONDONTWRITEBYTECODE (set on this project's VM) compiles every supervisor module from
    source at each start, 0.1-0.5 s that no installed worker pays (nor the peers the figures
    compare with, installed by pip)."""
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(REPO / "supervisor")],
                   check=True)
ACCOUNT_KEY = ("Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/"
               "KBHBeksoGMGw==")

Row = tuple[str, str, str, str]  # figure, value, reference, verdict


class BenchError(RuntimeError):
    """A measurement could not be taken (a wait timed out, a supervisor failed)."""


def wait_until(cond: Callable[[], object], timeout: float, interval: float = 0.01, *,
               what: str) -> None:
    """Poll ``cond`` until it is true; raise BenchError after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() >= deadline:
            raise BenchError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(interval)


def pct(values: list[float], p: float) -> float:
    values = sorted(values)
    if not values:
        return float("nan")
    k = (len(values) - 1) * p / 100
    lo, hi = int(k), min(int(k) + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (k - lo)


def all_dead(procs: list[psutil.Process]) -> bool:
    """Every process gone or a zombie (its parent has not reaped it yet)."""
    for p in procs:
        try:
            if p.status() != psutil.STATUS_ZOMBIE:
                return False
        except psutil.NoSuchProcess:
            continue
    return True


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def peer_venv(dist: str, version: str, requirement: str | None = None) -> Path:
    """The bin folder of a venv under ``.bench/`` holding ``dist`` at ``version`` (pip
    installs ``requirement``, default ``dist==version``, from the index), made once and
    made again only when the installed version differs: peers the bench compares with run
    in venvs of their own, never in the project's."""
    venv = REPO / ".bench" / f"{dist}-venv"
    py = venv / "bin" / "python"
    probe = [str(py), "-c", f"import importlib.metadata as m; print(m.version({dist!r}))"]
    if py.exists() and subprocess.run(probe, capture_output=True, text=True, timeout=60
                                      ).stdout.strip() == version:
        return venv / "bin"
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True,
                   timeout=120)
    subprocess.run([str(py), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                    requirement or f"{dist}=={version}"], check=True, timeout=900)
    return venv / "bin"


def log_tail(path: Path, chars: int = 2000) -> str:
    return path.read_text(errors="replace")[-chars:] if path.exists() else "(no log)"


def stop(proc: subprocess.Popen[bytes], timeout: float) -> None:
    """SIGTERM, then SIGKILL to its group if it is not gone within ``timeout`` (which raises:
    a supervisor that ignores SIGTERM is a finding, not a number)."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(10)
        raise BenchError(f"supervisor {proc.pid} still running {timeout:g} s after SIGTERM: "
                         "killed") from None


@contextmanager
def supervisor(args: list[str], cwd: Path, env: dict[str, str] | None = None,
               log: str = "sup.log", stop_timeout: float = 60.0,
               prog: list[str] | None = None) -> Iterator[subprocess.Popen[bytes]]:
    """A jobq-supervisor (or ``prog``: a command that runs one) in its own session, output in
    ``cwd/log``; however the block ends, it is stopped (``stop``) before the block is left."""
    full = dict(os.environ)
    full.update(env or {})
    with open(cwd / log, "wb") as out:
        cmd = [*(prog or [str(BIN / "jobq-supervisor")]), *args]
        proc = subprocess.Popen(cmd, cwd=cwd, env=full, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
        try:
            yield proc
        finally:
            stop(proc, stop_timeout)


@contextmanager
def dashboard(args: list[str], cwd: Path, log: str = "dashboard.err") -> Iterator[str]:
    """A ``jobq-ctl *args`` that serves the dashboard (``args``: the backend options,
    ``dashboard``, its own; a ``--bind`` with port 0) in its own session, its stderr in
    ``cwd/log``; the block gets its base URL, read from the first line it prints.  However
    the block ends, it is sent SIGTERM, and SIGKILL if it is not gone 10 s later."""
    err = cwd / log
    with open(err, "wb") as fh:
        proc = subprocess.Popen([str(BIN / "jobq-ctl"), *args], stderr=fh,
                                stdout=subprocess.DEVNULL, cwd=cwd, start_new_session=True)
    try:
        def url() -> str | None:
            m = re.search(r"dashboard on (http://\S+)", err.read_text(errors="replace"))
            if m is None and proc.poll() is not None:
                raise BenchError(f"the dashboard exited ({proc.returncode}): "
                                 f"{log_tail(err, 300).strip()}")
            return m.group(1).rstrip("/") if m else None
        wait_until(url, 30, 0.05, what="the dashboard's URL line")
        found = url()
        assert found is not None
        yield found
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)


def expect_exit(proc: subprocess.Popen[bytes], timeout: float, log: Path) -> None:
    """Wait for a supervisor that ends by itself (--exit-when-empty); raise unless it exits 0."""
    try:
        code = proc.wait(timeout)
    except subprocess.TimeoutExpired:
        raise BenchError(f"supervisor still running after {timeout:g} s:\n{log_tail(log)}"
                         ) from None
    if code != 0:
        raise BenchError(f"supervisor exited with {code}:\n{log_tail(log)}")


def json_log(path: Path) -> list[dict]:
    out = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def first(records: list[dict], text: str, log: Path, anywhere: bool = False) -> dict:
    """The first JSON record whose message starts with ``text`` (or holds it: ``anywhere``)."""
    for r in records:
        if r["message"].startswith(text) or (anywhere and text in r["message"]):
            return r
    raise BenchError(f"no log line {text!r} in {log}:\n{log_tail(log)}")


def ts(record: dict) -> float:
    """Epoch seconds of a JSON log record's UTC time stamp."""
    t = record["time"]
    return calendar.timegm(time.strptime(t[:19], "%Y-%m-%dT%H:%M:%S")) + int(t[20:23]) / 1000


def run_span(log: Path) -> float:
    """Seconds from the worker's start line to its summary line, in a JSON log."""
    records = json_log(log)
    start = first(records, "started: backend", log, anywhere=True)
    return ts(first(records, "summary:", log)) - ts(start)


class Azurite:
    """The Storage Queue emulator on a free loopback port (AZURITE_QUEUE_BIN, else the
    ``.azurite`` install that scripts/bench makes), killed by its PID's group."""

    def __init__(self, tmp: Path) -> None:
        binary = os.environ.get("AZURITE_QUEUE_BIN") or str(
            REPO / ".azurite" / "node_modules" / ".bin" / "azurite-queue")
        self.port = free_port()
        cwd = tmp / "azurite"
        cwd.mkdir(exist_ok=True)
        self.proc = subprocess.Popen(
            [binary, "--queueHost", "127.0.0.1", "--queuePort", str(self.port),
             "--inMemoryPersistence", "--skipApiVersionCheck", "--disableTelemetry", "--silent"],
            cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True)
        try:
            wait_until(self._up, 30, 0.1, what=f"Azurite ({binary}) to listen")
        except BaseException:
            self.close()
            raise
        self.conn_str = (f"DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;"
                         f"AccountKey={ACCOUNT_KEY};"
                         f"QueueEndpoint=http://127.0.0.1:{self.port}/devstoreaccount1")

    def _up(self) -> bool:
        with socket.socket() as s:
            return s.connect_ex(("127.0.0.1", self.port)) == 0

    def close(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(10)


@dataclass
class Bench:
    """One bench run: what a figure measures with and where it reports (main thread)."""

    tmp: Path
    quick: bool
    runs: int  # runs per figure (medians over them)
    n: int  # tasks per throughput run
    results: dict[str, object]
    rows: list[Row] = field(default_factory=list)
    azurite: Azurite | None = None  # running while a Figure(azurite=True) measures

    def row(self, figure: str, value: str, reference: str = "", verdict: str = "") -> None:
        self.rows.append((figure, value, reference, verdict))


@dataclass(frozen=True)
class Figure:
    """One line (or a few) of the table: ``measure`` runs the measurement, adds its results
    and its row(s) to the Bench.  ``azurite``: it needs ``bench.azurite`` (skipped with
    --skip-azurite)."""

    measure: Callable[[Bench], None]
    azurite: bool = False
