"""jobq-ctl's stdout when its reader goes away (``jobq-ctl peek | head -1``): the rest of the
output goes nowhere, quietly -- no BrokenPipeError traceback, and the exit status is the
command's own (main thread of jobq-ctl).

Not by giving SIGPIPE its default back: that would end the command at any write, half done,
and worker/main.py is shared with the worker, which must go on ignoring SIGPIPE.  Every command
acts before it prints (``push`` pushes every task, then prints the ids), so a closed stdout
cannot stop one half way: ``push ... | head -1`` pushed them all and exits 0.
"""

from __future__ import annotations

import os
import sys
from typing import Callable


def quiet_stdout() -> None:
    """The reader of stdout went away: send what is left to /dev/null, so that the next write
    and Python's flush at exit print no traceback."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def print_or_drop(text: str) -> None:
    """``print(text)``; a reader gone meanwhile gets nothing more, and the command goes on
    (``push`` prints every id and every skipped one's warning, and ``--wait`` waits)."""
    try:
        print(text)
    except BrokenPipeError:
        quiet_stdout()


def flush_or_drop() -> None:
    """Flush stdout; a reader gone meanwhile gets nothing more, and the command goes on (the
    ids of ``push --wait``: the wait is what is left to do)."""
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        quiet_stdout()


def run_quietly(main: Callable[[list[str] | None], int], argv: list[str] | None) -> int:
    """``main(argv)``'s exit status, whether or not stdout's reader is still there.

    The status of a command stopped by the closed pipe half way through its printing is 0:
    by then it did what it was asked (see above); only printing was left."""
    code = 0
    try:
        code = main(argv)
        sys.stdout.flush()  # now, not at exit: a reader gone by then ends as quietly
    except BrokenPipeError:
        quiet_stdout()
    return code
