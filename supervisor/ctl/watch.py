"""``jobq-ctl status --watch [SECONDS]`` and ``jobq-ctl workers --watch [SECONDS]``: the
command's output again every SECONDS (default 2) until Ctrl-C, which ends it with exit
status 0 and no traceback (main thread of jobq-ctl).

On a terminal each refresh redraws the screen in place (ANSI home + clear, as ``watch(1)``
does), the whole frame written at once so that it does not flicker; on anything else
(a pipe, a file, a CI log) each refresh is a plain block appended after the last, led by a
line with the time.  The wait between refreshes is an Event's, which a test or an embedding
caller can set to end the watch.  A queue or store that cannot be reached is a line in the
frame, and the next refresh tries again: a watch outlives a blip.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, TextIO

from ..core.options import UsageError, _duration

if TYPE_CHECKING:  # the parser imports this module: what only a watch needs loads then
    from .clients import Clients

DEFAULT_EVERY = 2.0  # seconds between refreshes when --watch has no value
CLEAR = "\x1b[H\x1b[2J"  # cursor home, erase the screen
Handler = Callable[[argparse.Namespace, "Clients"], int]


def add_watch_option(p: argparse.ArgumentParser) -> None:
    """``--watch [SECONDS]`` on a sub-command's parser (main thread)."""
    p.add_argument("--watch", nargs="?", type=_duration, const=DEFAULT_EVERY, default=None,
                   metavar="SECONDS",
                   help=f"refresh every SECONDS (default {DEFAULT_EVERY:g}) until Ctrl-C: in "
                        "place on a terminal, appended blocks otherwise; one queue, not "
                        "with --json")


def watched(handler: Handler) -> Handler:
    """``handler`` once, or again and again with ``--watch`` (main thread)."""

    def run(ns: argparse.Namespace, clients: Clients) -> int:
        every = getattr(ns, "watch", None)
        if every is None:
            return handler(ns, clients)
        if getattr(ns, "json", False):
            raise UsageError("--watch: not with --json (run the command in a loop instead)")
        if every <= 0:
            raise UsageError("--watch: must be more than 0 seconds")
        return watch(lambda: handler(ns, clients), every,
                     f"jobq-ctl {ns.command} --queue {ns.queue}")

    return run


def watch(render: Callable[[], object], every: float, title: str,
          out: TextIO | None = None, stop: threading.Event | None = None) -> int:
    """Print ``render``'s output every ``every`` seconds until ``stop`` is set or Ctrl-C;
    exit status 0 (main thread)."""
    from ..backends.base import BackendError
    from ..fleet.control.base import ControlStoreError
    from ..ops.times import iso

    out = sys.stdout if out is None else out
    stop = threading.Event() if stop is None else stop
    tty = out.isatty()
    try:
        while True:
            frame = io.StringIO()
            with contextlib.redirect_stdout(frame):
                try:
                    render()
                except (BackendError, ControlStoreError) as exc:
                    print(f"jobq-ctl: error: {exc} (trying again in {every:g}s)")
            head = f"Every {every:g}s: {title}    {iso(time.time())}  (Ctrl-C ends)\n"
            out.write(f"{CLEAR}{head}\n{frame.getvalue()}" if tty
                      else f"{head}{frame.getvalue()}\n")
            out.flush()
            if stop.wait(every):
                return 0
    except KeyboardInterrupt:  # the way out of a watch: not an error
        if tty:
            out.write("\n")
        return 0
