"""The one error both command lines share (cli.py parses, ctl.py runs sub-commands)."""

from __future__ import annotations


class UsageError(Exception):
    """Bad command line or configuration: one line on stderr, exit status 2."""
