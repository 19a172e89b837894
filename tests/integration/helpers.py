"""Task scripts used by the integration tests."""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psutil

from tests.conftest import Supervisor, marked_processes, wait_for

# A process that records when SIGTERM reached it (wall clock), then exits after a delay.
TERM_RECORDER = r'''
import os, signal, sys, time
out, delay = sys.argv[1], float(sys.argv[2])
def on_term(signum, frame):
    with open(out, "a") as fh:
        fh.write(f"{os.getpid()} {time.time()}\n")
    time.sleep(delay)
    os._exit(0)
signal.signal(signal.SIGTERM, on_term)
with open(out + ".ready", "a") as fh:
    fh.write(f"{os.getpid()}\n")
while True:
    signal.pause()
'''


# Every signal whose default action would end a worker and that the worker does something
# about (docs/reliability.rst, "Signals to the worker"), named here, not taken from the code
# under test; SIGPIPE and SIGXFSZ are ignored by Python itself.
WORKER_SIGNALS = tuple(getattr(signal, n) for n in (
    "SIGHUP", "SIGINT", "SIGQUIT", "SIGTERM", "SIGUSR1", "SIGUSR2", "SIGALRM", "SIGVTALRM",
    "SIGPROF", "SIGIO", "SIGPWR", "SIGSTKFLT", "SIGXCPU", "SIGXFSZ", "SIGPIPE")) + tuple(
    range(signal.SIGRTMIN, signal.SIGRTMAX + 1))
# Those of them a worker ignores and logs, carrying on (SIGUSR2 is a reload: test_reload.py).
LOGGED_AND_IGNORED = tuple(getattr(signal, n) for n in (
    "SIGALRM", "SIGVTALRM", "SIGPROF", "SIGIO", "SIGPWR", "SIGSTKFLT")) + (
    signal.SIGRTMIN, signal.SIGRTMIN + 5, signal.SIGRTMAX)


def ignoring(*sigs: int) -> tuple[str, ...]:
    """A prefix that starts the command after it with ``sigs`` ignored (SIG_IGN), as nohup
    (SIGHUP) and a script's background job (SIGINT, SIGQUIT) leave them."""
    return (sys.executable, "-c", "import os, signal, sys; "
            f"[signal.signal(s, signal.SIG_IGN) for s in {[int(s) for s in sigs]!r}]; "
            "os.execvp(sys.argv[1], sys.argv[1:])")


def signal_name(sig: int) -> str:
    """As the worker logs it: ``SIGUSR2``, ``SIGRTMIN+5``."""
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"SIGRTMIN+{sig - signal.SIGRTMIN}"


def write_recorder(tmp: Path) -> str:
    path = tmp / "term_recorder.py"
    path.write_text(TERM_RECORDER)
    return f"{sys.executable} {path}"


def ready_count(path: Path) -> int:
    ready = Path(str(path) + ".ready")
    return len(ready.read_text().split()) if ready.exists() else 0


def term_times(path: Path) -> list[float]:
    if not path.exists():
        return []
    return [float(line.split()[1]) for line in path.read_text().splitlines() if line.strip()]


def all_dead(procs: list[psutil.Process]) -> bool:
    for p in procs:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                return False
        except psutil.NoSuchProcess:
            continue
    return True


def death_time(procs: list[psutil.Process], timeout: float) -> float | None:
    """Poll until every process is gone; return the wall time it was first seen so."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all_dead(procs):
            return time.time()
        time.sleep(0.01)
    return None


def kill_and_watch(sup: Supervisor) -> tuple[float, float]:
    """SIGKILL ``sup``: (the wall time of the SIGKILL, the time its tasks' processes were all
    seen dead -- its lifeline kills them)."""
    ours = {c.pid for c in psutil.Process(sup.pid).children(recursive=True)}
    procs = [p for p in marked_processes() if p.pid in ours]
    assert procs
    dead: list[float] = []
    watcher = threading.Thread(target=lambda: dead.append(death_time(procs, 30) or 0.0))
    killed_at = time.time()
    sup.signal(signal.SIGKILL)
    watcher.start()
    assert sup.wait(10) == -signal.SIGKILL
    watcher.join()
    assert dead[0], "the killed worker's tasks outlived it"
    return killed_at, dead[0]


def cancel_dies_at_grace(sup: Any, store: Any, queue: str, task_id: str,
                         procs: list[psutil.Process], grace: float = 2.0) -> None:
    """Cancel a running task that ignores SIGTERM: its tree must die about ``grace`` after
    the worker's SIGTERM (the same check on every backend)."""
    from supervisor.fleet.control import Cancel

    store.put_cancel(Cancel(queue=queue, task_id=task_id, reason="grace", who="ops",
                            when=time.time(), grace=grace))
    sup.wait_log("cancelled: sending SIGTERM", 10)
    t_term = time.time()
    dead = death_time(procs, 20)
    assert dead is not None, "the task outlived its grace by far"
    assert dead - t_term >= grace - 0.3, "killed before the grace"
    assert dead - t_term < grace + 4.0


class HeldDatabase:
    """An exclusive lock on a SQLite file, held by a thread (see ``database_held``)."""

    def __init__(self, db: Path, seconds: float) -> None:
        self.db = db
        self.held, self.release = threading.Event(), threading.Event()
        self.thread = threading.Thread(target=self._hold, args=(seconds,))

    def _hold(self, seconds: float) -> None:
        conn = sqlite3.connect(self.db, timeout=30, isolation_level=None)
        try:
            conn.execute("BEGIN EXCLUSIVE")
            self.held.set()
            self.release.wait(seconds)
            conn.execute("ROLLBACK")
        finally:
            conn.close()

    def locked_until(self, task_id: str) -> float:
        """The task's LockedUntil: final, as nobody can write while the lock is held."""
        conn = sqlite3.connect(self.db, timeout=1)
        try:
            return conn.execute("SELECT locked_until FROM jobs WHERE id=?",
                                (task_id,)).fetchone()[0]
        finally:
            conn.close()


@contextmanager
def database_held(db: Path, seconds: float) -> Iterator[HeldDatabase]:
    """Hold the database exclusively for up to ``seconds`` (released when the block ends)."""
    hold = HeldDatabase(db, seconds)
    hold.thread.start()
    try:
        assert hold.held.wait(10)
        yield hold
    finally:
        hold.release.set()
        hold.thread.join()


def read_output(store: Any, key: Any) -> tuple[bytes, bool]:
    """All of an attempt's output in an output store (``key``: its AttemptKey), and whether
    it is marked complete."""
    out, offset = bytearray(), 0
    while True:
        chunk = store.read(key, offset)
        out += chunk.data
        if not chunk.data:
            return bytes(out), chunk.complete
        offset = chunk.offset


def one_error_line(res: subprocess.CompletedProcess[str], code: int) -> str:
    """The one line a jobq-ctl that failed with exit status ``code`` printed (it asserts
    there is exactly one, a ``jobq-ctl: error:`` line)."""
    assert res.returncode == code, (res.returncode, res.stdout, res.stderr)
    lines = res.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("jobq-ctl: error: "), res.stderr
    return lines[0]


def one_usage_line(res: subprocess.CompletedProcess[str], option: str) -> str:
    """The one line (naming ``option``) of a command that exited 2 on a usage error, with
    nothing on stdout."""
    assert res.returncode == 2, (res.returncode, res.stdout, res.stderr)
    lines = res.stderr.splitlines()
    assert len(lines) == 1 and option in lines[0], res.stderr
    assert res.stdout == ""
    return lines[0]


def beating_task(log: Path, first_beats: int = 400, later_beats: int = 5) -> str:
    """Attempt 1 runs long with a child in its group and one that left it (setsid); later
    attempts are short.  Every line: ``attempt start|beat|end epoch``."""
    line = f'echo "$JOBQ_ATTEMPT %s $(date +%%s.%%N)" >> {log}'
    return (f'if [ "$JOBQ_ATTEMPT" = 1 ]; then n={first_beats}; sleep 60 & setsid sleep 60 & '
            f'else n={later_beats}; fi; {line % "start"}; '
            f'while [ $n -gt 0 ]; do sleep 0.1; {line % "beat"}; n=$((n-1)); done; '
            f'{line % "end"}')


def runs(log: Path) -> dict[int, list[tuple[str, float]]]:
    out: dict[int, list[tuple[str, float]]] = {}
    for entry in log.read_text().splitlines() if log.exists() else []:
        attempt, what, ts = entry.split()
        out.setdefault(int(attempt), []).append((what, float(ts)))
    return out


def long_sleeps() -> int:
    """The task's ``sleep 60`` children alive (the beats' ``sleep 0.1`` come and go)."""
    n = 0
    for p in marked_processes():
        try:
            n += p.cmdline()[-1:] == ["60"]
        except psutil.Error:
            continue
    return n


def stopped(pid: int) -> bool:
    return psutil.Process(pid).status() == psutil.STATUS_STOPPED


FAST = ("--control-interval", "1", "--heartbeat-interval", "1")


def results(env: Any, task_id: str) -> list[dict[str, Any]]:
    res = env.ctl("result", task_id, "--json", check=False)
    if res.returncode == 1 and "no result recorded" in res.stderr:
        return []
    assert res.returncode == 0, res.stderr
    out: list[dict[str, Any]] = json.loads(res.stdout)
    return out


def gauges(path: Path) -> dict[str, float]:
    from prometheus_client.parser import text_string_to_metric_families

    if not path.exists():
        return {}
    return {s.name: s.value for family in text_string_to_metric_families(path.read_text())
            for s in family.samples}


def lock_loss_line(env: Any, steal: Callable[[str], None]) -> tuple[str, str]:
    """A worker of ``env`` (SQLite's or PostgreSQL's) running ``sleep 60`` whose lease
    ``steal(task_id)`` gives to another worker: its "finished after lock loss" line and its
    whole log, once it stopped (SIGTERM, exit 0)."""
    [task_id] = env.push("sleep 60")
    sup = env.supervisor("--lock-duration", "6", "--renew-interval", "1", "--poll-interval",
                         "0.2")
    wait_for(lambda: env.state(task_id) == "running", 30, what=f"task running\n{sup.log()}")
    steal(task_id)
    sup.wait_log("finished after lock loss", 30)
    sup.signal(signal.SIGTERM)
    assert sup.wait(30) == 0, sup.log()
    [line] = [x for x in sup.log().splitlines() if "finished after lock loss" in x]
    return line, sup.log()
