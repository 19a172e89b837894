"""logs: the hot-path lines come out exactly as ordinary log calls do; task output stays within
its budget, and what is dropped is counted."""

from __future__ import annotations

import io
import json
import logging
import queue
import re
import subprocess
import sys
import threading

import pytest

from supervisor.worker import logs

pytestmark = pytest.mark.timeout(30)

SCRIPT = r"""
import logging, sys
from supervisor.worker import logs
logs.setup_logging("INFO", sys.argv[1])
log = logging.getLogger("jobq.worker")
extra = {"task_id": "t1", "pid": 7, "attempt": 2}
log.info("started pid=%d (attempt %d of %d): %s", 7, 2, 5, "écho", extra=dict(extra))
logs.log_fast(log, logging.INFO, "started pid=%d (attempt %d of %d): %s", 7, 2, 5, "écho",
              extra=dict(extra))
logs.log_fast(log, logging.DEBUG, "not shown %s", 1, extra={})
logs.log_fast(log, logging.INFO, "bad %d", "x", extra={})
log.info("last")
"""


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_fast_lines_match_ordinary_ones(fmt):
    out = subprocess.run([sys.executable, "-c", SCRIPT, fmt], capture_output=True, text=True,
                         check=True).stderr.splitlines()
    assert len(out) == 4, out
    if fmt == "json":
        first, second = (json.loads(line) for line in out[:2])
        assert first.pop("time")[:16] == second.pop("time")[:16]
        assert first == second
        assert first["task_id"] == "t1" and first["message"].endswith("écho")
    else:
        assert out[0].split(" ", 2)[2] == out[1].split(" ", 2)[2]
        assert "[t1] started pid=7 (attempt 2 of 5): écho" in out[1]
    assert "could not be formatted" in out[2]  # a bad argument costs its line, nothing more
    assert "last" in out[3]


def test_without_our_writer_it_is_an_ordinary_log_call(caplog):
    log = logging.getLogger("jobq.test")
    with caplog.at_level(logging.INFO):
        logs.log_fast(log, logging.INFO, "hello %s", "there", extra={"task_id": "t9"})
    (record,) = [r for r in caplog.records if r.name == "jobq.test"]
    assert record.getMessage() == "hello there" and record.task_id == "t9"


class _Writer:
    """What the sink reads of the writer: the bytes of task output it took."""

    output_written = 0


def _sink() -> tuple[logs.OutputSink, queue.SimpleQueue, _Writer]:
    records: queue.SimpleQueue = queue.SimpleQueue()
    writer = _Writer()
    return logs.OutputSink(records, writer), records, writer  # type: ignore[arg-type]


def _take(records: queue.SimpleQueue, writer: _Writer) -> list:
    """Play the writer: take every queued item, charging output lines as it does."""
    out = []
    while not records.empty():
        item = records.get()
        if len(item) == 3:
            account, _created, text = item
            cost = len(text) + logs.LINE_COST
            account.written += cost
            writer.output_written += cost
            out.append(text)
        else:
            out.append(item[3] % item[4])
    return out


LINE = b"y" * 100
PER_TASK = logs.TASK_BUDGET // (100 + logs.LINE_COST)  # lines of LINE one task may queue


def test_a_task_over_its_budget_loses_the_excess_with_a_count():
    sink, records, writer = _sink()
    chatty, quiet = logs.OutputAccount("jobq.task", "a"), logs.OutputAccount("jobq.task", "b")
    sink.offer(chatty, [LINE] * (PER_TASK + 500))
    sink.offer(quiet, [b"quiet line"])  # another task's lines are not held to chatty's budget
    sink.offer(chatty, [LINE] * 10)  # still over half its budget: dropped too
    assert sink.dropped == chatty.dropped == 510
    out = _take(records, writer)
    assert out == [LINE.decode()] * PER_TASK + ["quiet line"]
    sink.offer(chatty, [b"after"])  # room again: the count comes first, then the line
    assert _take(records, writer) == ["[510 lines of output dropped: log writer behind]",
                                      "after"]
    assert chatty.dropped == 0 and not chatty.dropping and sink.dropped == 510


def test_dropping_resumes_only_below_half_the_budget():
    sink, records, writer = _sink()
    account = logs.OutputAccount("jobq.task", "a")
    sink.offer(account, [LINE] * (PER_TASK + 1))
    for _ in range(PER_TASK // 2 - 1):  # the writer takes lines one by one...
        records.get()
        account.written += 100 + logs.LINE_COST
    sink.offer(account, [LINE])
    assert account.dropped == 2  # ...not yet half free: without hysteresis, a marker a line
    records.get()
    records.get()
    account.written += 2 * (100 + logs.LINE_COST)
    sink.offer(account, [LINE])
    assert account.dropped == 0


def test_all_tasks_together_stay_within_the_total_budget():
    sink, records, writer = _sink()
    accounts = [logs.OutputAccount("jobq.task", str(i))
                for i in range(logs.TOTAL_BUDGET // logs.TASK_BUDGET + 2)]
    for account in accounts:
        sink.offer(account, [LINE] * PER_TASK)
    assert sink.queued <= logs.TOTAL_BUDGET
    assert sink.dropped >= PER_TASK  # the last tasks found no room


def test_a_task_end_flushes_its_count_even_with_no_line_after_it():
    sink, records, writer = _sink()
    account = logs.OutputAccount("jobq.task", "a")
    sink.offer(account, [LINE] * (PER_TASK + 3))
    sink.marker(account)  # what TaskOutput.finish does, before "finished" is logged
    out = _take(records, writer)
    assert out[-1] == "[3 lines of output dropped: log writer behind]"
    sink.marker(account)
    assert records.empty()  # nothing dropped since: no marker


class _Stream(io.StringIO):
    def __init__(self, lines: int) -> None:
        super().__init__()
        self.want, self.done = lines, threading.Event()

    def flush(self) -> None:
        if self.getvalue().count("\n") >= self.want:
            self.done.set()


def test_writer_writes_on_without_waiting_while_records_are_queued(monkeypatch):
    # With a gather wait after every write, 10 batches would take 10 * 30 s here.
    monkeypatch.setattr(logs, "GATHER", 30.0)
    records: queue.SimpleQueue = queue.SimpleQueue()
    stream = _Stream(10 * logs.MAX_BATCH)
    writer = logs.LogWriter(records, stream, logs.TextFormatter())
    for i in range(10 * logs.MAX_BATCH):
        records.put((0.0, "jobq", logging.INFO, "line %d", (i,), {}))
    writer.start()
    try:
        assert stream.done.wait(20)
    finally:
        writer.stop()
    lines = stream.getvalue().splitlines()
    assert [line.rsplit(" ", 1)[1] for line in lines] == [str(i) for i in range(len(lines))]


FLOOD = r"""
import logging, sys
from supervisor.worker import logs
logs.setup_logging("INFO", "text")
sink = logs.output_sink(logging.getLogger("jobq.task"))
account = logs.OutputAccount("jobq.task", "t1")
line = b"z" * 100
for _ in range(200):
    sink.offer(account, [line] * 1000)
sink.marker(account)
logging.getLogger("jobq.worker").info("summary: the last line")
print(sink.dropped, file=sys.stdout)
"""


def test_the_supervisor_lines_come_last_and_nothing_is_lost_uncounted():
    res = subprocess.run([sys.executable, "-c", FLOOD], capture_output=True, text=True,
                         check=True, timeout=60)
    lines = res.stderr.splitlines()
    assert lines[-1].endswith("summary: the last line")
    shown = sum(line.endswith("z" * 100) for line in lines)
    counted = sum(int(m) for m in re.findall(r"\[(\d+) lines of output dropped", res.stderr))
    assert int(res.stdout) == counted > 0
    assert shown + counted == 200_000


@pytest.mark.parametrize("formatter", [logs.TextFormatter, logs.JsonFormatter])
@pytest.mark.parametrize("created", [1_700_000_000.0, 1_700_000_000.9996, 1_700_000_001.0417])
def test_output_lines_are_formatted_as_any_other_record(formatter, created):
    fmt = formatter()
    text = 'écho "quoted" \\ 100%s'
    record = logs._record(created, "jobq.task", logging.INFO, "%s", (text,),
                          {"task_id": "t-1", "stream": "output"})
    assert fmt.format_output(created, "jobq.task", "t-1", text) == fmt.format(record)


@pytest.mark.parametrize("formatter", [logs.TextFormatter, logs.JsonFormatter])
def test_control_characters_of_an_output_line_are_escaped_by_both_paths(formatter):
    fmt = formatter()
    text = "a\rb\x1b[2Kc\x00d\x7fe\x9bf\tg\u00e9"
    record = logs._record(1_700_000_000.0, "jobq.task", logging.INFO, "%s", (text,),
                          {"task_id": "t-1", "stream": "output"})
    line = fmt.format_output(1_700_000_000.0, "jobq.task", "t-1", text)
    assert line == fmt.format(record)
    if formatter is logs.TextFormatter:
        assert line.endswith("[t-1]| a\\rb\\x1b[2Kc\\x00d\\x7fe\\x9bf\tg\u00e9")
    else:
        assert json.loads(line)["message"] == text
    assert line.replace("\t", " ").isprintable()



FORGED_ID = "x\n2030-01-01 00:00:00,000 ERROR   [admin] fake\x1b[2K\u202e"


@pytest.mark.parametrize("formatter", [logs.TextFormatter, logs.JsonFormatter])
def test_a_task_id_or_argument_from_a_message_writes_no_line_of_its_own(formatter):
    """Issue 39 §5: the id and a string argument (a command) on every path, escaped."""
    fmt = formatter()
    output = fmt.format_output(1_700_000_000.0, "jobq.task", FORGED_ID, "out")
    record = logs._record(1_700_000_000.0, "jobq.worker", logging.ERROR, "refused: %s",
                          ("cmd\n2030 FAKE\u202e",), {"task_id": FORGED_ID})
    line = fmt.format(record)
    for text in (output, line):
        assert "\n" not in text and "\x1b" not in text and "\u202e" not in text
    if formatter is logs.TextFormatter:
        shown_id = "[x\\n2030-01-01 00:00:00,000 ERROR   [admin] fake\\x1b[2K\\u202e]"
        assert output.endswith(f" {shown_id}| out")
        assert line.endswith(f"ERROR   {shown_id} refused: cmd\\n2030 FAKE\\u202e")
    else:
        assert json.loads(line)["task_id"] == FORGED_ID, "JSON escapes, and keeps, it all"


PIECES = r"""
import logging, os, sys
from supervisor.worker import logs, output_pump as output
# 100-char lines, and lines the pump cuts in MAX_LINE pieces, in reads of 4 KiB
data = (b"a" * 100 + b"\n") * 30000 + (b"b" * (3 * output.MAX_LINE + 7) + b"\n") * 20
data += (b"c" * 100 + b"\n") * 30000 + b"d" * (output.MAX_LINE + 1)  # no newline at the end


def run(logger):
    out = output.TaskOutput("t1", open(os.devnull, "rb"), lambda: None, logger)
    for i in range(0, len(data), 4096):
        out.feed(data[i:i + 4096])
    out.finish()


class Count(logging.Handler):
    n = 0

    def emit(self, record):
        Count.n += 1


reference = logging.getLogger("reference")  # a handler of its own: ordinary log calls
reference.addHandler(Count())
reference.propagate = False
reference.setLevel(logging.INFO)
run(reference)
logs.setup_logging("INFO", "text")
run(logging.getLogger("jobq.task"))
print(Count.n, logs.dropped_lines())
"""


def test_every_piece_of_output_is_logged_or_counted():
    res = subprocess.run([sys.executable, "-c", PIECES], capture_output=True, text=True,
                         check=True, timeout=60)
    pieces, dropped = map(int, res.stdout.split())
    assert pieces > 60_000 + 20 * 3  # the long lines did come in pieces
    shown = res.stderr.count("[t1]| ")
    counted = sum(int(m) for m in re.findall(r"\[(\d+) lines of output dropped", res.stderr))
    assert dropped == counted > 0
    assert shown + counted == pieces


STRAYS = r"""
import logging, threading, warnings
from supervisor.worker import logs, lifeline
logs.setup_logging("INFO", "json")
logging.getLogger("jobq").info("first")
warnings.warn("a library's warning")
thread = threading.Thread(target=lambda: 1 / 0, name="doomed")
thread.start()
thread.join()
logs.stop_logging()
lifeline.say("json", "lifeline: a line of the helper", processes=3)
"""


def test_with_json_every_line_on_stderr_is_json_warnings_thread_errors_lifeline():
    res = subprocess.run([sys.executable, "-c", STRAYS], capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 0, res.stderr
    records = [json.loads(line) for line in res.stderr.splitlines()]
    assert [r["logger"] for r in records] == ["jobq", "py.warnings", "jobq", "jobq.lifeline"]
    assert "a library's warning" in records[1]["message"]
    assert records[2]["message"] == "unexpected error on thread doomed"
    assert "ZeroDivisionError" in records[2]["exc"]
    assert records[3]["processes"] == 3 and records[3]["level"] == "WARNING"
