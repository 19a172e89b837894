"""The small text files the kernel publishes (/proc, /sys), read whole: the boot id of a
SQLite lease's owner (backends/sqlite/owner.py) and the DMI strings that tell an Azure VM
(worker/preemption.py).  Called from any thread.
"""

from __future__ import annotations


def read_kernel_file(path: str, default: str, encoding: str = "utf-8") -> str:
    """The file's text without the surrounding white space; ``default`` when it cannot be
    read (missing, no permission: a container, another kernel).  A byte ``encoding`` cannot
    decode becomes U+FFFD, never an error."""
    try:
        with open(path, encoding=encoding, errors="replace") as fh:
            return fh.read().strip()
    except OSError:
        return default
