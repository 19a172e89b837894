"""logs.log_fast: the hot-path lines must come out exactly as ordinary log calls do."""

from __future__ import annotations

import json
import logging
import subprocess
import sys

import pytest

from supervisor import logs

pytestmark = pytest.mark.timeout(30)

SCRIPT = r"""
import logging, sys
from supervisor import logs
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
