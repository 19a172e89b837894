"""Issue 13, part 2: a task that prints fast neither takes the supervisor down by memory nor
costs the log its supervisor lines, other tasks' lines, or lease timing."""

from __future__ import annotations

import re
import time

import psutil
import pytest

from tests.conftest import Supervisor, marked_processes, wait_for
from tests.integration.helpers import database_held, death_time

# serial: a flood of output: CPU-heavy, measures memory
pytestmark = [pytest.mark.serial, pytest.mark.timeout(120)]

MIB = 1 << 20
LINES = 1_500_000  # the task: 150 MB in lines of 100 characters
FLOOD = f"head -c {LINES * 100} /dev/zero | tr '\\0' x | fold -w 100"
CHATTY = "for i in 1 2 3 4 5; do echo chatty-$JOBQ_TASK_ID-$i; sleep 1; done"
DROPPED = re.compile(r"\[(\d+) lines of output dropped: log writer behind\]")


def peak_rss(sup: Supervisor, timeout: float = 100.0) -> int:
    """The supervisor's largest RSS, sampled until it exits."""
    proc, peak = psutil.Process(sup.pid), 0
    deadline = time.monotonic() + timeout
    while sup.proc.poll() is None and time.monotonic() < deadline:
        try:
            peak = max(peak, proc.memory_info().rss)
        except psutil.Error:
            break
        time.sleep(0.01)
    return peak


@pytest.mark.parametrize("chatty", [0, 3])
def test_a_flood_keeps_memory_bounded_and_every_supervisor_line(env, chatty):
    env.push("true")
    idle_sup = env.supervisor("--exit-when-empty")
    idle = peak_rss(idle_sup)
    assert idle_sup.wait(60) == 0

    ids = env.push(FLOOD, *[CHATTY] * chatty)
    metrics = env.tmp / "metrics.prom"
    sup = env.supervisor("--exit-when-empty", "-n", str(1 + chatty),
                         "--metrics-file", str(metrics))
    peak = peak_rss(sup)
    assert sup.wait(60) == 0
    print(f"peak RSS {peak / MIB:.1f} MiB, idle {idle / MIB:.1f} MiB")
    assert peak - idle < 100 * MIB

    lines = sup.log().splitlines()
    shown = sum(line.endswith("x" * 100) for line in lines)
    counted = sum(int(n) for n in DROPPED.findall("\n".join(lines)))
    assert shown + counted == LINES  # every line is in the log or in a count
    assert counted > 0, "nothing dropped: the test no longer floods the writer"
    dropped_metric = re.search(r"^jobq_task_output_lines_dropped_total\{.*\} (\S+)$",
                               metrics.read_text(), re.M)
    assert dropped_metric and float(dropped_metric.group(1)) == counted
    for task_id in ids[1:]:
        assert sum(f"| chatty-{task_id}-" in line for line in lines) == 5
    for task_id in ids:
        assert sum(f"[{task_id}] started pid=" in line for line in lines) == 1
        assert sum(f"[{task_id}] finished: exit status 0" in line for line in lines) == 1
    assert f" summary: succeeded={len(ids)} " in lines[-1]
    assert "finished: exit status 0" in lines[-2]
    assert not any(DROPPED.search(line) for line in lines[-2:])


def test_the_task_log_file_gets_every_line(env):
    lines = LINES  # the whole flood: 1.5 million lines, 150 MB
    [task_id] = env.push(FLOOD)
    logs = env.tmp / "tasklogs"
    logs.mkdir()
    sup = env.supervisor("--exit-when-empty", "--task-log-dir", str(logs))
    assert sup.wait(90) == 0
    data = (logs / f"{task_id}.1.log").read_bytes()
    assert len(data) == lines * 100 + lines - 1  # fold: no newline after the last line
    assert data.count(b"\n") == lines - 1
    assert DROPPED.search(sup.log()), "nothing dropped from the log: no flood to prove"


TASK = 'if [ "$JOBQ_ATTEMPT" = 1 ]; then sleep 60 & sleep 60; true; else echo second-run; fi'
YES = 'if [ "$JOBQ_ATTEMPT" = 1 ]; then yes ' + "y" * 99 + "; fi"


def test_lock_loss_beside_a_flood_kills_before_expiry(env):
    task_id, flood_id = env.push(TASK, YES)
    sup = env.supervisor("-n", "2", "--lock-duration", "6", "--renew-interval", "1",
                         "--reaper-interval", "1", "--stale-lock-age", "0",
                         "--exit-when-empty", "--retry-delay", "0")
    wait_for(lambda: sum(p.name() == "sleep" for p in marked_processes()) == 2
             and any(p.name() == "yes" for p in marked_processes()), 30,
             what="both tasks running")
    procs = [p for p in marked_processes() if p.pid != sup.pid]
    wait_for(lambda: env.job(task_id)["locked_until"] > env.job(task_id)["locked_at"] + 6.5,
             20, what="a renewal")
    sup.wait_log("lines of output dropped", 30)  # the writer is flooded from here on
    with database_held(env.db, 15) as hold:
        locked_until = min(hold.locked_until(task_id), hold.locked_until(flood_id))
        dead = death_time(procs, 14)
        assert dead is not None, "tasks still alive while their leases could not be renewed"
        assert dead < locked_until, (
            f"tasks died {dead - locked_until:.2f}s after a LockedUntil passed")
        print(f"killed {locked_until - dead:.2f}s before LockedUntil")
        hold.thread.join()
    assert sup.wait(60) == 0
    log = sup.log()
    assert log.count("lock lost") >= 2
    assert "second-run" in log
    assert [r[1:3] for r in env.rows()] == [("succeeded", 2), ("succeeded", 2)]
