"""Logging set-up: text or one JSON object per line, with the task id where there is one."""

from __future__ import annotations

import atexit
import json
import logging
import logging.handlers
import queue
import sys
import time

_STANDARD = set(vars(logging.LogRecord("x", 0, "x", 0, "x", None, None))) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
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
        return json.dumps(out, default=str)


class TextFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)-7s %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        task_id = getattr(record, "task_id", None)
        if task_id:
            head, _, rest = text.partition(record.levelname)
            pad = " " * max(0, 7 - len(record.levelname))
            sep = "|" if getattr(record, "stream", None) == "output" else ""
            text = f"{head}{record.levelname}{pad} [{task_id}]{sep}{rest[len(pad):]}"
        return text


class _QueueHandler(logging.handlers.QueueHandler):
    """Hands the record over as it is: our formatters need its extra attributes, and merging
    args into the message is cheap enough to leave to the listener."""

    def prepare(self, record: logging.LogRecord) -> logging.LogRecord:
        if record.exc_info:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
            record.exc_info = None
        return record


def setup_logging(level: str, fmt: str) -> None:
    """Records are built where they are logged; formatting and writing happen on a listener
    thread, so a busy main loop does not wait on stderr (stopped, and drained, at exit)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    records: queue.SimpleQueue[logging.LogRecord] = queue.SimpleQueue()
    listener = logging.handlers.QueueListener(records, handler)
    listener.start()
    atexit.register(listener.stop)
    root = logging.getLogger()
    root.handlers[:] = [_QueueHandler(records)]
    root.setLevel(level.upper())
    # The Azure SDKs log every HTTP request at INFO.
    logging.getLogger("azure").setLevel(max(logging.WARNING, root.level))
