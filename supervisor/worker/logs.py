"""Logging set-up: text or one JSON object per line, with the task id where there is one.

One writer thread formats and writes every record.  Its queue holds two kinds of lines: the
supervisor's own (started, finished, lock lost, summary...), always taken, and its tasks'
output lines, taken only within a byte budget (``OutputSink``): a task printing faster than
stderr takes its lines has the excess dropped and counted, with a marker line in its place.
One queue, not two, so every line keeps its order: a task's output comes before its
"finished" line.
"""

from __future__ import annotations

import atexit
import json
import logging
import logging.handlers
import queue
import re
import sys
import threading
import time
from typing import TextIO

from ..core.shown import ShownFormatter, shown
from ..core.threads import start_thread

MAX_BATCH = 256  # lines per write: a burst is written in pieces, never held back
GATHER = 0.02  # seconds the writer lets records gather after a write that emptied its queue
TASK_BUDGET = 1 << 20  # bytes of one task's output lines waiting for the writer
TOTAL_BUDGET = 16 << 20  # bytes of all tasks' output lines waiting for the writer
LINE_COST = 200  # bytes a queued line takes beyond its text (tuple, str header, float)
DROPPED = "[%d lines of output dropped: log writer behind]"
# What a terminal acts on instead of showing -- C0 controls but tab, DEL, C1 controls -- as a
# task prints it: escaped in a text log line, so ``\r`` or an escape sequence cannot move the
# cursor back over the task id or clear the line.  (JSON escapes them all itself: our
# encoder writes everything outside printable ASCII as a \u escape.)
_CONTROLS = {c: f"\\x{c:02x}" for c in (*range(0x20), 0x7F, *range(0x80, 0xA0)) if c != 0x09}
_CONTROLS.update({0x0D: "\\r", 0x0A: "\\n"})
_CONTROL = re.compile("[" + re.escape("".join(map(chr, _CONTROLS))) + "]")
_STANDARD = set(vars(logging.LogRecord("x", 0, "x", 0, "x", None, None))) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    """One JSON object per line (writer thread).  The second's text and the encoder are
    reused: a new ``json.dumps(default=...)`` encoder and ``strftime`` per record were half
    of the formatting cost, and every task logs two lines."""

    _encoder = json.JSONEncoder(default=str)

    def __init__(self) -> None:
        super().__init__()
        self._second = -1
        self._second_text = ""

    def format(self, record: logging.LogRecord) -> str:
        second = int(record.created)
        if second != self._second:
            self._second = second
            self._second_text = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
        out = {
            "time": f"{self._second_text}.{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_"):
                out[key] = value
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        elif record.exc_text:
            out["exc"] = record.exc_text
        return self._encoder.encode(out)

    def format_output(self, created: float, logger: str, task_id: str, text: str) -> str:
        """A task's output line, exactly as ``format`` would make it, without a LogRecord
        (writer thread): 3 us instead of 15 a line, and a flood is nothing but such lines."""
        second = int(created)
        if second != self._second:
            self._second = second
            self._second_text = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
        return self._encoder.encode({
            "time": f"{self._second_text}.{int((created - second) * 1000):03d}Z",
            "level": "INFO", "logger": logger, "message": text, "task_id": task_id,
            "stream": "output"})


def escape_controls(text: str) -> str:
    """``text`` with the characters of ``_CONTROLS`` written as ``\\r``, ``\\x1b``... (writer
    thread, per output line).  Callers test ``text.isprintable()`` first: one C scan, true of
    almost every line; a regex substitution is twice as fast as ``str.translate`` on a line
    full of escape sequences (a progress bar), measured."""
    return _CONTROL.sub(_escaped, text)


def _escaped(match: re.Match[str]) -> str:
    return _CONTROLS[ord(match.group())]


class TextFormatter(ShownFormatter):
    """``TIME LEVEL [TASK]| text`` lines; a task's output line has its control characters
    escaped (``escape_controls``): the output store and a task's log file keep the bytes as
    printed.  The task id and the record's string arguments come from messages: ``shown``
    (core/shown.py), so that none writes a line of its own or reorders one."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)-7s %(message)s")
        self._second = -1
        self._second_text = ""

    def format_output(self, created: float, logger: str, task_id: str, text: str) -> str:
        """A task's output line, exactly as ``format`` would make it, without a LogRecord
        (writer thread)."""
        if not text.isprintable():
            text = escape_controls(text)
        if not task_id.isprintable():
            task_id = shown(task_id)
        second = int(created)
        if second != self._second:
            self._second = second
            self._second_text = time.strftime(self.default_time_format,
                                              self.converter(second))
        return (f"{self._second_text},{int((created - second) * 1000):03d} INFO    "
                f"[{task_id}]| {text}")

    def formatMessage(self, record: logging.LogRecord) -> str:
        # a task's output line keeps its tabs and format characters, as format_output's does
        if record.args and getattr(record, "stream", None) != "output":
            return super().formatMessage(record)
        return logging.Formatter.formatMessage(self, record)

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        task_id = getattr(record, "task_id", None)
        output = getattr(record, "stream", None) == "output"
        if output and not text.isprintable():
            text = escape_controls(text)
        if task_id:
            if not isinstance(task_id, str) or not task_id.isprintable():
                task_id = shown(str(task_id))
            head, _, rest = text.partition(record.levelname)
            pad = " " * max(0, 7 - len(record.levelname))
            sep = "|" if output else ""
            text = f"{head}{record.levelname}{pad} [{task_id}]{sep}{rest[len(pad):]}"
        return text


class _QueueHandler(logging.handlers.QueueHandler):
    """Hands the record over as it is: our formatters need its extra attributes, and merging
    args into the message is cheap enough to leave to the writer thread."""

    def prepare(self, record: logging.LogRecord) -> logging.LogRecord:
        if record.exc_info:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
            record.exc_info = None
        return record


class OutputAccount:
    """One task's output lines in the writer's queue.  ``queued`` is written by the pump thread
    only and ``written`` by the writer thread only, so either reads their difference without a
    lock; ``dropped``/``dropping`` belong to the pump thread."""

    __slots__ = ("logger", "extra", "queued", "written", "dropped", "dropping")

    def __init__(self, logger: str, task_id: str) -> None:
        self.logger = logger
        self.extra = {"task_id": task_id, "stream": "output"}
        self.queued = self.written = 0
        self.dropped = 0
        self.dropping = False


class LogWriter:
    """The thread that formats and writes every record (started by ``setup_logging``).

    It takes all records that are waiting and writes them with one write and one flush; when
    that emptied its queue it lets the next ones gather for ``GATHER`` seconds: with many short
    tasks, waking this thread and writing once per record was a good part of the supervisor's
    cost per task.  So a line may trail its event by that much; while records wait it writes
    on at once, as fast as stderr takes them.  Stopped, after draining the queue, by ``stop``
    (at exit)."""

    _STOP = object()

    def __init__(self, records: queue.SimpleQueue, stream: TextIO,
                 formatter: logging.Formatter) -> None:
        self.records = records
        self.stream = stream
        self.formatter = formatter
        self.stopped = threading.Event()
        self.output_written = 0  # bytes of task output taken off the queue (writer thread)
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = start_thread(self._run, "log-writer", bulk=True)

    def stop(self, timeout: float = 10.0) -> None:
        """Any thread (atexit): write what is queued, then end the thread.  The task output
        in the queue is bounded (``TOTAL_BUDGET``), so this takes a fraction of a second
        unless stderr itself is stuck."""
        if not self.stopped.is_set():
            self.stopped.set()
            self.records.put(self._STOP)
            if self._thread is not None:
                self._thread.join(timeout)

    def _run(self) -> None:
        """Writer thread."""
        while True:
            item = self.records.get()
            lines = []
            done = False
            while True:
                if item is self._STOP:  # only stop() queues it; what comes after is lost
                    done = True
                    break
                lines.append(self._format(item))
                if len(lines) >= MAX_BATCH:
                    break
                try:
                    item = self.records.get_nowait()
                except queue.Empty:
                    break
            if lines:
                try:
                    self.stream.write("\n".join(lines) + "\n")
                    self.stream.flush()
                except (OSError, ValueError):
                    pass  # stderr closed or full: logging must never stop the supervisor
            if done:
                return
            if self.records.empty():
                # While we wait here, logging a record is an append without a thread wake-up.
                self.stopped.wait(GATHER)

    def _format(self, item: logging.LogRecord | tuple) -> str:
        try:
            if isinstance(item, tuple):
                if len(item) == 3:  # a task's output line: (account, created, text)
                    account, created, text = item
                    cost = len(text) + LINE_COST
                    account.written += cost
                    self.output_written += cost
                    fast = getattr(self.formatter, "format_output", None)
                    if fast is not None:
                        return fast(created, account.logger, account.extra["task_id"], text)
                    item = (created, account.logger, logging.INFO, "%s", (text,),
                            account.extra)
                record = _record(*item)
            else:
                record = item
            return self.formatter.format(record)
        except Exception as exc:  # a bad argument in one log call must not end the writer
            msg = item[3] if isinstance(item, tuple) else item.msg
            return f"log record could not be formatted: {exc!r} ({msg!r})"


class OutputSink:
    """Takes task output lines into the writer's queue within the byte budgets (pump thread).

    Per task (``TASK_BUDGET``), so one task printing fast never costs another task its lines,
    and in all (``TOTAL_BUDGET``), so the supervisor's memory is bounded however many tasks
    print.  Lines over budget are dropped and counted; once the task's queued lines are down
    to half its budget its lines are taken again, after one marker line with the count (half,
    not any room at all: otherwise a marker would come every few lines).  The per-task log
    file is written before this, and gets everything."""

    def __init__(self, records: queue.SimpleQueue, writer: LogWriter) -> None:
        self.records = records
        self.writer = writer
        self.queued = 0  # bytes of task output put on the queue
        self.dropped = 0  # lines dropped, all tasks, since start (read by the metrics)

    def taking(self, account: OutputAccount) -> bool:
        """Whether the task's next lines would be queued, at least in part (pump thread): if
        not, the pump only counts them, without splitting them into lines."""
        if not account.dropping:
            return True
        return (account.queued - account.written <= TASK_BUDGET // 2
                and self.queued - self.writer.output_written <= TOTAL_BUDGET // 2)

    def offer(self, account: OutputAccount, lines: list[bytes]) -> None:
        """Queue what fits of one task's lines, drop and count the rest (pump thread)."""
        if account.dropping:
            if not self.taking(account):
                self.drop(account, len(lines))
                return
            self.marker(account)
        task_room = TASK_BUDGET - (account.queued - account.written)
        total_room = TOTAL_BUDGET - (self.queued - self.writer.output_written)
        now = time.time()
        put = self.records.put
        taken = 0
        for raw in lines:
            text = raw.decode("utf-8", "replace")
            cost = len(text) + LINE_COST
            if cost > task_room or cost > total_room:
                self.drop(account, len(lines) - taken)
                break
            task_room -= cost
            total_room -= cost
            account.queued += cost
            self.queued += cost
            put((account, now, text))
            taken += 1

    def marker(self, account: OutputAccount) -> None:
        """The count of the task's lines dropped since its last line (pump thread); never
        itself dropped."""
        if account.dropped:
            put = self.records.put
            put((time.time(), account.logger, logging.WARNING, DROPPED, (account.dropped,),
                 {"task_id": account.extra["task_id"], "dropped_lines": account.dropped}))
        account.dropped = 0
        account.dropping = False

    def drop(self, account: OutputAccount, n: int) -> None:
        """Count ``n`` of the task's lines as dropped (pump thread)."""
        account.dropped += n
        account.dropping = True
        self.dropped += n


# The queue handler setup_logging installed on the root logger, its queue and output sink.
_FAST: list[tuple[_QueueHandler, queue.SimpleQueue, OutputSink]] = []


def log_fast(logger: logging.Logger, level: int, msg: str, *args: object,
             extra: dict[str, object]) -> None:
    """``logger.log(level, msg, *args, extra=extra)`` for the lines every task logs (main
    thread).  With our writer the only handler, the record is built on the writer thread:
    ~1 us here instead of ~10 us through ``Logger._log`` (two such lines per task were a
    sixth of the main loop's time on short tasks).  Otherwise (tests, other handlers) it is
    an ordinary log call."""
    if not logger.isEnabledFor(level):
        return
    if _fast_path(logger):
        _FAST[0][1].put((time.time(), logger.name, level, msg, args, extra))
    else:
        logger.log(level, msg, *args, extra=extra)


def _fast_path(logger: logging.Logger) -> bool:
    """Whether our writer is the one handler of ``logger``'s records (any thread)."""
    handlers = logging.root.handlers
    return bool(_FAST) and len(handlers) == 1 and handlers[0] is _FAST[0][0] \
        and logger.propagate and not logger.handlers and not logger.filters


def output_sink(logger: logging.Logger) -> OutputSink | None:
    """Where the pump puts ``logger``'s task output lines: our writer's sink, or None when
    records go elsewhere (tests, other handlers: then they are ordinary log calls)."""
    return _FAST[0][2] if _fast_path(logger) else None


def dropped_lines() -> int:
    """Task output lines dropped since start because the writer was behind (any thread)."""
    return _FAST[0][2].dropped if _FAST else 0


def _record(created: float, name: str, level: int, msg: str, args: tuple,
            extra: dict[str, object]) -> logging.LogRecord:
    """The LogRecord of a ``log_fast`` line, as ``Logger.makeRecord`` would build it then
    (writer thread)."""
    record = logging.LogRecord(name, level, "(unknown file)", 0, msg, args, None)
    record.created = created
    record.msecs = int((created - int(created)) * 1000) + 0.0
    record.__dict__.update(extra)
    return record


_WRITERS: list[LogWriter] = []  # started by setup_logging


def stop_logging() -> None:
    """Write what is queued and end the writer thread, as the atexit hook would (main
    thread, when the process ends without the interpreter's teardown)."""
    for writer in _WRITERS:
        writer.stop()


def json_logging() -> bool:
    """Whether ``setup_logging`` made every line of the log stream JSON (any thread)."""
    return bool(_WRITERS) and isinstance(_WRITERS[-1].formatter, JsonFormatter)


def _thread_died(args: threading.ExceptHookArgs) -> None:
    """``threading.excepthook``: a thread's uncaught exception is a log record (the default
    hook prints a bare traceback on stderr, not a line of the log's format)."""
    if args.exc_type is not SystemExit:
        name = args.thread.name if args.thread is not None else "?"
        exc = args.exc_value  # None only for an exception raised without a value
        logging.getLogger("jobq").error(
            "unexpected error on thread %s", name,
            exc_info=(args.exc_type, exc, args.exc_traceback) if exc is not None else True)


def setup_logging(level: str, fmt: str) -> None:
    """Records are built where they are logged; formatting and writing happen on the writer
    thread, so a busy main loop does not wait on stderr (stopped, and drained, at exit).
    Python's warnings and a thread's uncaught exception become records too: the writer is
    the one writer of the process's stderr, so with ``--log-format json`` every line is
    JSON (the lifeline helper formats its few lines the same way: worker/lifeline.py)."""
    # Attributes no formatter of ours prints; not collecting them makes every record cheaper
    # (the logging HOWTO's "Optimization" section lists these switches).
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
    logging._srcfile = None  # no caller lookup: our lines do not print file or line
    # log records, ``log_fast``'s tuples and task output lines, for the writer thread
    records: queue.SimpleQueue[object] = queue.SimpleQueue()
    writer = LogWriter(records, sys.stderr,
                       JsonFormatter() if fmt == "json" else TextFormatter())
    writer.start()
    atexit.register(writer.stop)
    _WRITERS.append(writer)
    root = logging.getLogger()
    handler = _QueueHandler(records)
    root.handlers[:] = [handler]
    _FAST[:] = [(handler, records, OutputSink(records, writer))]
    set_level(level)
    logging.captureWarnings(True)
    threading.excepthook = _thread_died


def set_level(level: str) -> None:
    """The log threshold, at start and on a reload (main thread).  logging's per-logger
    caches are cleared by setLevel, so every thread sees it at its next line."""
    root = logging.getLogger()
    root.setLevel(level.upper())
    # The Azure SDKs log every HTTP request at INFO.
    logging.getLogger("azure").setLevel(max(logging.WARNING, root.level))
