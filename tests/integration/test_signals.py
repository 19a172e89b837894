"""Issue 25, class 2: the signals a worker gets in real life, on a real jobq-supervisor with a
task running.  A stop signal (SIGHUP: the SSH terminal closed) is a graceful stop: the summary
line, the task back to pending with no attempt counted, no process left.  A signal that means
nothing to a worker is one log line and the worker goes on.  SIGQUIT logs every thread's
stack.  None of them may end the worker without its shutdown path."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import psutil
import pytest

from tests.conftest import Supervisor, command, marked_processes, wait_for
from tests.integration.helpers import (
    LOGGED_AND_IGNORED,
    all_dead,
    ignoring,
    signal_name,
    write_recorder,
)

pytestmark = pytest.mark.timeout(120)


def _running(env, *args: str, prefix: tuple[str, ...] = ()) -> tuple[Supervisor, list]:
    """A supervisor with one long task running: it, and every process of the run (the
    supervisor, its lifeline helper, the task's processes)."""
    env.push("sleep 300")
    sup = env.supervisor(*args, prefix=prefix)
    tasks = wait_for(lambda: [p for p in marked_processes() if p.pid != sup.pid], 30,
                     what="task running")
    procs = [psutil.Process(sup.pid), *psutil.Process(sup.pid).children(recursive=True)]
    assert len(procs) >= 3, procs  # the supervisor, the lifeline, the task's shell
    assert tasks and all(p in procs for p in tasks)  # type: ignore[union-attr]
    return sup, procs


def _stopped_cleanly(env, sup: Supervisor, procs: list, stop: str) -> None:
    """Exit 0 after the summary line naming ``stop``; the task pending again, its attempt
    not counted; no process of the run left."""
    assert sup.wait(30) == 0, sup.log()[-3000:]
    summary = sup.log().strip().splitlines()[-1]
    assert "summary: " in summary and f"stop='{stop}'" in summary and "exit=0" in summary, \
        sup.log()[-3000:]
    assert "requeued=1" in summary, summary
    assert env.rows("SELECT status, attempt FROM jobs") == [("pending", 0)]
    assert wait_for(lambda: all_dead(procs), 10, what="every process of the run gone")


@pytest.mark.parametrize("sig", [signal.SIGHUP, signal.SIGXCPU])
def test_sighup_and_sigxcpu_stop_like_sigterm(env, sig):
    """SIGHUP (a closed SSH terminal) and SIGXCPU (the worker's own CPU limit) used to kill
    the worker outright, its task left `running` in the database."""
    sup, procs = _running(env)
    sup.signal(sig)
    _stopped_cleanly(env, sup, procs, f"{sig.name} received")


def test_signals_meaning_nothing_are_logged_and_the_worker_goes_on(env):
    """SIGALRM, SIGVTALRM, SIGPROF, SIGIO, SIGPWR, SIGSTKFLT and real-time signals
    each used to kill the worker: now one line each, the task runs on untouched; SIGQUIT
    logs the threads' stacks; a SIGHUP after all that still stops cleanly."""
    sup, procs = _running(env)
    for sig in LOGGED_AND_IGNORED:
        sup.signal(sig)
        sup.wait_log(f"{signal_name(sig)} received: ignored", 10)
    sup.signal(signal.SIGQUIT)
    sup.wait_log("SIGQUIT received: stacks of every thread follow", 10)
    log = sup.log()
    assert "Thread MainThread" in log and "Thread spawner-0" in log, log[-3000:]
    assert all(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in procs)
    assert env.rows("SELECT status FROM jobs") == [("running",)]
    sup.signal(signal.SIGHUP)
    _stopped_cleanly(env, sup, procs, "SIGHUP received")


def test_sighup_stays_ignored_under_nohup(env):
    """Started with SIGHUP ignored (``nohup jobq-supervisor &``), the worker keeps ignoring
    it -- logged -- and a SIGTERM still stops it cleanly."""
    sup, procs = _running(env, prefix=ignoring(signal.SIGHUP))
    sup.signal(signal.SIGHUP)
    sup.wait_log("SIGHUP received: ignored (the worker was started with it ignored", 10)
    assert env.rows("SELECT status FROM jobs") == [("running",)]
    sup.signal(signal.SIGTERM)
    _stopped_cleanly(env, sup, procs, "SIGTERM received")


def test_sighup_to_a_foreground_workers_process_group(env):
    """The terminal's SIGHUP reaches the worker's whole foreground process group (here: a
    shell that started it, and the worker): the same clean stop, and the task -- in a session
    of its own -- gets SIGTERM from the worker, not the hangup."""
    rec = write_recorder(env.tmp)
    out = env.tmp / "rec"
    env.push(f"exec {rec} {out} 0")
    # bash's trap is a handler (an ignored SIGHUP would be the worker's too): it outlives
    # the hangup and reports how the worker ended.
    sup = env.supervisor(prefix=("/bin/bash", "-c", 'trap : HUP; "$@"; echo rc=$? >&2',
                                 "bash"))
    wait_for(lambda: (out.parent / "rec.ready").exists(), 30, what="task ready")
    worker = wait_for(lambda: [c for c in psutil.Process(sup.pid).children()
                               if "jobq-supervisor" in " ".join(c.cmdline())], 10,
                      what="worker started")[0]  # type: ignore[index]
    procs = [worker, *worker.children(recursive=True)]
    os.killpg(sup.pid, signal.SIGHUP)
    assert sup.wait(30) == 0
    log = sup.log()
    assert "stop='SIGHUP received'" in log and "rc=0" in log, log[-3000:]
    assert out.exists(), "the task did not get the worker's SIGTERM"
    assert env.rows("SELECT status, attempt FROM jobs") == [("pending", 0)]
    assert wait_for(lambda: all_dead(procs), 10, what="every process of the run gone")


def test_lifeline_helper_ignores_the_workers_signals(env):
    """A signal meant for the worker that reaches its lifeline helper (``pkill -HUP -f jobq``)
    must not take the helper down while the worker runs: the task keeps its protection."""
    sup, procs = _running(env)
    lifeline = [p for p in procs if "supervisor.worker.lifeline" in " ".join(p.cmdline())]
    assert len(lifeline) == 1, procs

    def ignored() -> set[int]:  # from the helper's main(), not during its start
        with open(f"/proc/{lifeline[0].pid}/status") as fh:
            mask = int(next(ln for ln in fh if ln.startswith("SigIgn:")).split()[1], 16)
        return {s for s in range(1, 65) if mask & (1 << (s - 1))}

    sent = (signal.SIGHUP, signal.SIGUSR2, signal.SIGQUIT, signal.SIGALRM, signal.SIGRTMIN)
    wait_for(lambda: set(sent) <= ignored(), 10, what="the helper ignoring them")
    for sig in sent:
        lifeline[0].send_signal(sig)
    # Delivery shows no event: a fixed window in which a killed helper would be seen gone.
    with pytest.raises(psutil.TimeoutExpired):
        lifeline[0].wait(1)
    assert lifeline[0].is_running() and lifeline[0].status() != psutil.STATUS_ZOMBIE
    sup.signal(signal.SIGTERM)
    _stopped_cleanly(env, sup, procs, "SIGTERM received")


def test_worker_keeps_ignoring_sigpipe_when_its_log_reader_goes(env):
    """The jobq-ctl fix for ``| head`` lives in code the worker shares: the worker must still
    ignore SIGPIPE, and survive a log pipe whose reader went away."""
    ids = env.push(*[f"echo line-{i}" for i in range(20)])
    script = (f'"$@" 2>&1 | head -1 > {env.tmp / "first"}; '
              f'echo "${{PIPESTATUS[0]}}" > {env.tmp / "rc"}')
    proc = subprocess.Popen(["/bin/bash", "-c", script, "bash", *command("jobq-supervisor"),
                             "--sqlite-path", str(env.db), "--exit-when-empty"],
                            cwd=env.tmp, start_new_session=True)
    try:
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    assert (env.tmp / "rc").read_text().split() == ["0"]  # not 141: no SIGPIPE death
    assert env.rows("SELECT status FROM jobs") == [("succeeded",)] * len(ids)


# Sends the worker a signal of its own the moment the Worker object is being built -- after
# the backend opened, before the main loop runs: a window no handler of the worker's own
# covered (the test injects only the timing; the rest is the real command).
SIGNAL_WHILE_BUILDING = r'''
import os, sys
from supervisor.worker import loop as worker
build, signum = worker.Worker.__init__, int(sys.argv[1])
def init(self, *args, **kw):
    os.kill(os.getpid(), signum)
    build(self, *args, **kw)
worker.Worker.__init__ = init
from supervisor.worker.main import worker_entry
sys.argv = ["jobq-supervisor", *sys.argv[2:]]
worker_entry()
'''


@pytest.mark.parametrize("sig", [signal.SIGHUP, signal.SIGTERM])
def test_a_stop_signal_before_the_main_loop_runs_is_a_clean_stop(env, sig):
    env.push("echo never")
    script = env.tmp / "building.py"
    script.write_text(SIGNAL_WHILE_BUILDING)
    res = subprocess.run([sys.executable, str(script), str(int(sig)), *env.base_args()],
                         capture_output=True, text=True, timeout=60, cwd=env.tmp)
    assert res.returncode == 0, res.stderr
    summary = res.stderr.strip().splitlines()[-1]
    assert f"stop='{sig.name} received'" in summary and "exit=0" in summary, res.stderr
    assert env.rows("SELECT status, attempt FROM jobs") == [("pending", 0)]
