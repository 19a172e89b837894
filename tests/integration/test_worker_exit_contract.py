"""Issue 14 (what a new operator hits in the first hour): the worker's side.

--max-consecutive-failures starts nothing once it decided to stop; --task-log-dir is created
at start; the exit and log contract (the summary is the last line; SIGTERM while the backend
is unreachable at start is a stop like any other).
"""

from __future__ import annotations

import signal

import pytest

pytestmark = pytest.mark.timeout(90)


@pytest.mark.parametrize("pause", ["", "sleep 0.3; "])
def test_failure_limit_starts_nothing_once_stopping(env, pause):
    """The issue's commands: A and B fail, the worker stops; C never starts, and goes back
    to the queue untouched (received ahead or not), exit 3."""
    ran = env.tmp / "ran.txt"
    # Without a pause the tasks are short enough for a receive to take C ahead of time.
    a, b, c = env.push(*[f"echo {n} >> {ran}; {pause}exit 1" for n in "ABC"],
                       extra=("--max-attempts", "1"))
    sup = env.supervisor("--max-consecutive-failures", "2", "--exit-when-empty")
    assert sup.wait(60) == 3
    log = sup.log()
    stop = log.index("stopping (too many consecutive failures)")
    assert " started pid=" not in log[stop:], log
    assert "preempted" not in log, log
    assert ran.read_text().split() == ["A", "B"]
    assert [env.job(t)["status"] for t in (a, b)] == ["failed", "failed"]
    assert (env.job(c)["status"], env.job(c)["attempt"]) == ("pending", 0)


def test_task_log_dir_is_created_at_start(env):
    logs = env.tmp / "not" / "yet"
    [tid] = env.push("echo into-the-file")
    sup = env.supervisor("--exit-when-empty", "--task-log-dir", str(logs))
    assert sup.wait(30) == 0
    assert (logs / f"{tid}.1.log").read_text().strip() == "into-the-file"
    warnings = [ln for ln in sup.log().splitlines()
                if " WARNING " in ln and "tasks run as root" not in ln]
    assert not warnings, sup.log()


def test_task_log_dir_that_cannot_be_created_is_exit_2(env):
    (env.tmp / "a-file").write_text("")
    env.push("echo never")
    sup = env.supervisor("--exit-when-empty", "--task-log-dir", str(env.tmp / "a-file" / "x"))
    assert sup.wait(30) == 2
    lines = sup.log().strip().splitlines()
    assert len(lines) == 1 and "--task-log-dir" in lines[0] and "a-file" in lines[0], lines
    assert env.rows("SELECT status, attempt FROM jobs") == [("pending", 0)]


# An account on a loopback port nobody listens on: every start-up attempt is refused.
UNREACHABLE = ("DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey="
               "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/"
               "KBHBeksoGMGw==;QueueEndpoint=http://127.0.0.1:1/devstoreaccount1")


def _last_line(log: str) -> str:
    return log.strip().splitlines()[-1]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1,
                                 signal.SIGXCPU])
def test_stop_signal_during_start_up_retry_is_a_stop(env, sig):
    sup = env.supervisor("--backend", "storage-queue", "--connection-string", UNREACHABLE,
                         base=False)
    sup.wait_log("retrying in 2s")  # in the pause after the second refused attempt
    sup.signal(sig)
    assert sup.wait(30) == 0
    last = _last_line(sup.log())
    assert "summary: succeeded=0" in last and f"{sig.name} received" in last, sup.log()
    assert "exit=0" in last


def test_other_signals_during_start_up_retry_are_logged(env):
    """Issue 25: SIGUSR2 and the like used to kill a worker still opening its backend."""
    sup = env.supervisor("--backend", "storage-queue", "--connection-string", UNREACHABLE,
                         base=False)
    sup.wait_log("retrying in 2s")
    for sig in (signal.SIGUSR2, signal.SIGALRM, signal.SIGPWR):
        sup.signal(sig)
        sup.wait_log(f"{sig.name} received: ignored", 10)
    sup.signal(signal.SIGQUIT)
    sup.wait_log("SIGQUIT received: stacks of every thread follow", 10)
    sup.wait_log("retrying in 4s")  # still retrying
    sup.signal(signal.SIGTERM)
    assert sup.wait(30) == 0
    assert "SIGTERM received" in _last_line(sup.log())


def test_summary_is_the_last_line_after_leftover_cleanup(env):
    """A leftover that ignores SIGTERM writes a line while the worker cleans up on its way
    out (its LEFTOVER_GRACE outlasts the task's OUTPUT_GRACE): the summary still ends the log."""
    env.push("(trap '' TERM; sleep 1.5; echo late-line) & exit 0")
    sup = env.supervisor("--exit-when-empty")
    assert sup.wait(30) == 0
    log = sup.log()
    assert "leftover" in log and "late-line" in log, log
    assert _last_line(log).split(None, 3)[-1].startswith("summary:"), log


@pytest.mark.parametrize("option", ["--idle-timeout", "--time-limit"])
def test_idle_timeout_and_time_limit_stop_at_info(env, option):
    sup = env.supervisor(option, "1", "--poll-interval", "0.2")
    assert sup.wait(30) == 0
    log = sup.log()
    stop = [ln for ln in log.splitlines() if "stopping (" in ln]
    assert len(stop) == 1 and " INFO " in stop[0], log
    assert "summary:" in _last_line(log)
