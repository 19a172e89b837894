"""Text a message controls, made safe to show in a log line or a page (any thread).

A task id, a command or a worker name comes from whoever can write to the queue.  Written
raw into a text log, a newline starts a line the attacker wrote ("2024-... ERROR [other]
..."), ``ESC [`` sequences move the cursor or recolour the terminal of whoever reads the log,
and U+202E (right-to-left override) and its kin reorder what follows, so a line reads other
than it is -- in a log and in a page alike (HTML escaping leaves them alone).  ``shown``
writes each such character as a visible escape instead: C0 and C1 controls and DEL (``\\n``,
``\\r``, ``\\t``, ``\\x1b``), Unicode format characters (category Cf: bidi controls, zero
width characters, the BOM), line and paragraph separators (Zl, Zp) and lone surrogates.
The result is one line of text that shows every character the message had, though not
reversibly: a backslash in the original is left as it is.
"""

from __future__ import annotations

import logging
import unicodedata
from collections.abc import Mapping

_ESCAPED = {"Cc", "Cf", "Cs", "Zl", "Zp"}
_SHORT = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escaped(char: str) -> str:
    short = _SHORT.get(char)
    if short is not None:
        return short
    code = ord(char)
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def shown(text: str, lines: bool = False) -> str:
    """``text`` with the characters above escaped; ``lines``: keep newlines and tabs (text
    shown in a ``<pre>``, e.g. a task's output tail).  Almost every string is printable, and
    ``str.isprintable`` (one C scan, false for every escaped character) lets it through as
    it is."""
    if text.isprintable():
        return text
    # A character at a time: only text that is not printable gets here (Python's own
    # printable test also fails spaces other than " ", private-use and unassigned code
    # points, which are kept).
    keep = "\n\t" if lines else ""
    return "".join(_escaped(c) if c not in keep and unicodedata.category(c) in _ESCAPED
                   else c for c in text)


class ShownFormatter(logging.Formatter):
    """A text formatter whose lines show a record's string arguments (and exceptions) through
    ``shown``: the arguments are where a message's strings enter a log line -- the format
    string is ours.  ``record.message`` keeps the escaped text (the record is formatted
    once, by the one handler).  A record with ``multiline=True`` (extra) keeps its
    arguments' newlines (SIGQUIT's stack dump).  ``format`` runs on the thread that writes
    the line."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        # Formatter.format has merged the arguments into record.message: when that is
        # printable (nearly always: one C scan) nothing comes from a message to escape.
        if record.args and not record.message.isprintable():
            shown_in = shown_args(record.args, getattr(record, "multiline", False))
            record.message = str(record.msg) % shown_in
        return super().formatMessage(record)


def shown_args(args: tuple[object, ...] | Mapping[str, object],
               lines: bool = False) -> tuple[object, ...] | Mapping[str, object]:
    """A log record's ``args`` with each string, and each exception's text, ``shown``;
    numbers and other objects as they are (``%d`` needs the number)."""
    if isinstance(args, Mapping):
        return {k: _shown_arg(v, lines) for k, v in args.items()}
    return tuple(_shown_arg(a, lines) for a in args)


def _shown_arg(value: object, lines: bool) -> object:
    if isinstance(value, str):
        return shown(value, lines)
    if isinstance(value, BaseException):
        text = str(value)
        return value if text.isprintable() else shown(text, lines)
    return value
