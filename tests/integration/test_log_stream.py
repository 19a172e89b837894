"""Issue 25: what a real worker writes on its log stream (stderr).  Control characters a task
prints are escaped in the text log line, and kept as printed by the output store and the
per-task log file; with ``--log-format json`` every line is JSON, the lifeline helper's and a
start-up error's too."""

from __future__ import annotations

import json
import signal
import subprocess

import psutil
import pytest

from tests.conftest import command, wait_for

pytestmark = pytest.mark.timeout(120)

# \r, an erase-line and a colour escape sequence, a NUL, DEL and a C1 CSI (UTF-8 c2 9b)
PRINTS = r"printf 'left\rright \033[2K\033[31mred\000nul\177del\302\233c1 tab\there\n'"
RAW = "left\rright \x1b[2K\x1b[31mred\x00nul\x7fdel\x9bc1 tab\there"
ESCAPED = r"left\rright \x1b[2K\x1b[31mred\x00nul\x7fdel\x9bc1 tab" + "\there"
CONTROLS = [b"\r", b"\x1b", b"\x00", b"\x7f", "\x9b".encode()]


def _logs(env, task_id: str) -> bytes:
    """``jobq-ctl logs ID``'s stdout, as bytes."""
    res = subprocess.run([*command("jobq-ctl"), *env.base_args(), "logs", task_id],
                         capture_output=True, timeout=60, cwd=env.tmp)
    assert res.returncode == 0, res.stderr
    return res.stdout


def test_text_log_escapes_control_characters_the_store_and_task_log_keep_them(env):
    [tid] = env.push(PRINTS)
    task_logs = env.tmp / "tasklogs"
    sup = env.supervisor("--exit-when-empty", "--task-log-dir", str(task_logs))
    assert sup.wait(30) == 0
    log = sup.log_path.read_bytes()
    for raw in CONTROLS:
        assert raw not in log, f"{raw!r} reached the log stream raw"
    (line,) = [x for x in log.decode().splitlines() if f"[{tid}]| " in x]
    assert line.endswith(f"[{tid}]| {ESCAPED}"), line
    assert _logs(env, tid) == RAW.encode() + b"\n", "the output store keeps the bytes"
    assert (task_logs / f"{tid}.1.log").read_bytes() == RAW.encode() + b"\n"


def test_text_log_escapes_control_characters_of_the_command_it_starts(env):
    [tid] = env.push("true # \x1b[2Jcleared\rover\n: next")
    sup = env.supervisor("--exit-when-empty")
    assert sup.wait(30) == 0
    log = sup.log_path.read_bytes()
    for raw in (b"\r", b"\x1b"):
        assert raw not in log, f"{raw!r} of the command reached the log stream raw"
    (line,) = [x for x in log.decode().splitlines() if f"[{tid}]" in x and "started" in x]
    assert r"true # \x1b[2Jcleared\rover\n: next" in line, line


def test_json_log_line_carries_the_text_as_printed(env):
    [tid] = env.push(PRINTS)
    sup = env.supervisor("--exit-when-empty", "--log-format", "json")
    assert sup.wait(30) == 0
    records = [json.loads(x) for x in sup.log().splitlines()]
    (out,) = [r for r in records if r.get("stream") == "output" and r["task_id"] == tid]
    assert out["message"] == RAW
    log = sup.log_path.read_bytes()
    assert not [c for c in CONTROLS if c in log], "JSON escapes them"


def _lifeline_of(sup) -> psutil.Process:
    found = wait_for(lambda: [p for p in psutil.Process(sup.pid).children()
                              if "supervisor.worker.lifeline" in " ".join(p.cmdline())], 30,
                     what="the lifeline helper")
    return found[0]


def test_json_log_when_the_lifeline_kills_after_a_sigkill_of_the_supervisor(env):
    # The setsid'd sleep leaves the task's process group: the helper finds it by its marker
    # after the group strike, and says so on the log stream.
    [tid] = env.push("setsid sleep 300 & echo started; sleep 300")
    sup = env.supervisor("--log-format", "json")
    sup.wait_log('"message": "started"')
    helper = _lifeline_of(sup)
    sup.signal(signal.SIGKILL)
    sup.wait(30)
    sup.wait_log("supervisor gone; killed")
    helper.wait(30)
    records = [json.loads(line) for line in sup.log().splitlines()]
    (gone,) = [r for r in records if r["logger"] == "jobq.lifeline"]
    assert gone["level"] == "WARNING" and gone["processes"] >= 1
    assert any(r.get("task_id") == tid for r in records)


def test_json_log_a_start_up_error_is_a_json_line(env):
    not_a_dir = env.tmp / "file"
    not_a_dir.write_text("")
    sup = env.supervisor("--log-format", "json", "--task-log-dir", str(not_a_dir))
    assert sup.wait(30) == 2
    (record,) = [json.loads(line) for line in sup.log().splitlines()]
    assert record["level"] == "ERROR" and record["exit_status"] == 2
    assert "--task-log-dir" in record["message"]
