"""core/shown.py: the one escape for a message's strings in log lines and pages, and the text
formatter that applies it to a record's arguments (issue 39 §5)."""

from __future__ import annotations

import logging

import pytest

from supervisor.core.shown import ShownFormatter, shown

pytestmark = pytest.mark.timeout(30)


@pytest.mark.parametrize("raw,escaped", [
    ("t-1", "t-1"),
    ("é ü 日本 🙂 a b", "é ü 日本 🙂 a b"),  # printable text, a plain space: as it is
    ("a\nb\rc\td", "a\\nb\\rc\\td"),
    ("\x1b[2K\x07\x7f\x9b", "\\x1b[2K\\x07\\x7f\\x9b"),  # C0, DEL, C1
    ("abc\u202edef\u2066\u200b\ufeff", "abc\\u202edef\\u2066\\u200b\\ufeff"),  # Cf
    ("a\u2028b\u2029", "a\\u2028b\\u2029"),  # line and paragraph separators
    ("\U000e0041tag", "\\U000e0041tag"),  # a Cf outside the BMP (tag character)
    ("x\udcffy", "x\\udcffy"),  # a lone surrogate
    ("nb\u00a0sp", "nb\u00a0sp"),  # Python's isprintable fails it; not ours to escape
])
def test_controls_and_format_characters_are_escaped(raw: str, escaped: str) -> None:
    assert shown(raw) == escaped
    assert "\n" not in shown(raw)


def test_lines_keeps_newlines_and_tabs_for_pre_blocks() -> None:
    assert shown("a\n\tb\x1b\u202e", lines=True) == "a\n\tb\\x1b\\u202e"


def _record(msg: str, *args: object, **extra: object) -> logging.LogRecord:
    record = logging.LogRecord("jobq", logging.ERROR, __file__, 1, msg, args, None)
    record.__dict__.update(extra)
    return record


def test_the_formatter_escapes_string_arguments_and_exceptions_only() -> None:
    fmt = ShownFormatter("%(message)s")
    record = _record("refused %s (%d, %.1f) %r: %s", "id\n2030 FAKE\u202e", 3, 1.5,
                     ["a"], ValueError("bad\x1b[31m"))
    assert fmt.format(record) == "refused id\\n2030 FAKE\\u202e (3, 1.5) ['a']: bad\\x1b[31m"
    assert record.args[0] == "id\n2030 FAKE\u202e", "the record itself is left as it was"
    assert fmt.format(_record("ok %(id)s", {"id": "a\nb"})) == "ok a\\nb"
    # our own format string may hold a newline; a multiline record keeps its arguments'
    stacks = _record("stacks follow\n%s", "Thread 1\n  File x\x1b", multiline=True)
    assert fmt.format(stacks) == "stacks follow\nThread 1\n  File x\\x1b"
