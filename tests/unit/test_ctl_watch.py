"""ctl/watch.py in-process: the loop ends when its Event is set (no sleep: the render sets
it), a queue that cannot be reached is a line in the frame and the watch goes on, and a
terminal gets the clear sequence before each frame."""

from __future__ import annotations

import io
import threading

from supervisor.backends.base import BackendError
from supervisor.ctl.watch import CLEAR, watch


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


class Ticks(threading.Event):
    """An Event whose waits return at once, recording how long each was asked to be: the
    time between refreshes passes without a sleep."""

    def __init__(self) -> None:
        super().__init__()
        self.waits: list[float | None] = []

    def wait(self, timeout: float | None = None) -> bool:
        self.waits.append(timeout)
        return self.is_set()


def test_blocks_until_the_event_and_an_error_is_a_line_of_its_frame() -> None:
    stop, out, calls = Ticks(), io.StringIO(), []

    def render() -> None:
        calls.append(1)
        if len(calls) == 2:
            raise BackendError("database is locked")
        print(f"refresh {len(calls)}")
        if len(calls) == 3:
            stop.set()

    assert watch(render, 30.0, "jobq-ctl status --queue q", out, stop) == 0
    text = out.getvalue()
    assert len(calls) == 3 and text.count("Every 30s: jobq-ctl status --queue q") == 3
    assert "refresh 1" in text and "refresh 3" in text
    assert "jobq-ctl: error: database is locked (trying again in 30s)" in text
    assert CLEAR not in text
    assert stop.waits == [30.0, 30.0, 30.0]  # one wait after each refresh, on the Event


def test_a_terminal_is_redrawn_in_place() -> None:
    stop, out = Ticks(), Terminal()
    watch(lambda: (print("frame"), stop.set()), 30.0, "jobq-ctl workers", out, stop)
    assert out.getvalue().startswith(CLEAR + "Every 30s: jobq-ctl workers")
