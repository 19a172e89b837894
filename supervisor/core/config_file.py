"""The ``--config`` INI file, read the same way by ``jobq-supervisor`` and ``jobq-ctl``
(core/options.py's parsers; main thread).

* One section, ``[jobq-supervisor]``; keys before any section count as its.  Another section
  or a broken header line is refused.
* Every key is the full long name of a worker option (no abbreviation, unlike a flag): a
  key the worker does not know is refused by both commands alike; ``jobq-ctl`` uses those
  of its own and passes over the rest.
* Every value is checked as its option checks it, so that the error names the file, the
  line and the key instead of the ``--key=value`` configargparse makes of it.
* A relative path (an option added with ``path=True``) is relative to the directory of the
  file, so that ``jobq-ctl --config /etc/jobq/worker.ini`` from any directory reaches the
  worker's database; flags and environment values stay relative to the working directory.

Errors are ConfigFileParserException: configargparse turns them into the parser's one-line
UsageError (exit status 2).
"""

from __future__ import annotations

import argparse
import os
import re
from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import Union

import configargparse

SECTION = "jobq-supervisor"
# The attribute usage._Parser.add_argument(..., path=True) sets on an option's action.
PATH_ATTR = "jobq_path"
# The attribute of the --config option's action (config_flag.py finds the file by it).
CONFIG_ATTR = "jobq_config"
# An option of the command line only (``--check-config``): no INI key, as --version.
CLI_ONLY_ATTR = "jobq_cli_only"
_HEADER = re.compile(r"\[([^\[\]]*)\]\s*(?:[#;].*)?")
# A value as configargparse reads it: text, or a list for ``key = [a, b]``
IniValue = Union[str, list[str]]
_BOOLEANS = ("true", "false", "yes", "no", "on", "off", "1", "0")


class IniFile(configargparse.DefaultConfigFileParser):
    """configargparse's INI parser, strict (see the module docstring).  ``options`` gives
    the INI keys and their actions (the worker's, for both commands)."""

    def __init__(self, options: Callable[[], dict[str, argparse.Action]]) -> None:
        super().__init__()
        self.options = options
        # key -> (file, line) of each value read, for errors found later (Settings)
        self.origins: dict[str, tuple[str, int]] = {}
        # the file whose text is parsed (configargparse hands it over as a nameless stream)
        self.path: str | None = None

    def parse(self, stream: Iterable[str]) -> OrderedDict[str, IniValue]:
        name = self.path or str(getattr(stream, "name", "the config file"))
        base = os.path.dirname(os.path.abspath(name))
        options = self.options()
        items: OrderedDict[str, IniValue] = OrderedDict()
        for number, raw in enumerate(stream, 1):
            line = raw.strip()
            where = f"{name} line {number}"
            if not line or line[0] in "#;" or line.startswith("---"):
                continue
            if line.startswith("["):
                header = _HEADER.fullmatch(line)
                if header is None:
                    raise configargparse.ConfigFileParserException(
                        f"{where}: broken section header {line!r} (expected [{SECTION}])")
                if header.group(1).strip() != SECTION:
                    raise configargparse.ConfigFileParserException(
                        f"{where}: unknown section [{header.group(1).strip()}] (the only "
                        f"one is [{SECTION}])")
                continue
            try:
                ((key, value),) = super().parse([line]).items()
            except configargparse.ConfigFileParserException:
                raise configargparse.ConfigFileParserException(
                    f"{where}: expected 'key = value', got {line!r}") from None
            key = key[2:] if key.startswith("--") else key
            action = options.get(key)
            if action is None:
                import difflib  # only for this error: not on every start

                close = difflib.get_close_matches(key, options, n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise configargparse.ConfigFileParserException(
                    f"{where}: unknown key {key!r}{hint}")
            problem = _check(action, value)
            if problem:
                raise configargparse.ConfigFileParserException(f"{where}: {key}: {problem}")
            if getattr(action, PATH_ATTR, False):
                value = _resolve(value, base, isinstance(action, argparse._AppendAction))
            items[key] = value
            self.origins[key] = (name, number)
        return items


def _check(action: argparse.Action, value: IniValue) -> str | None:
    """What is wrong with an INI value for ``action`` (as argparse would check it), or None."""
    if action.nargs == 0:  # a switch: configargparse adds the flag for a true value
        if isinstance(value, str) and value.lower() in _BOOLEANS:
            return None
        return f"expected true or false, got {value!r}"
    if isinstance(value, list) and not isinstance(action, argparse._AppendAction):
        return f"takes one value, not a list {value!r}"
    for one in value if isinstance(value, list) else [value]:
        text = str(one)
        converted: object = text
        if callable(action.type):
            try:
                converted = action.type(text)
            except argparse.ArgumentTypeError as exc:
                return str(exc)
            except (TypeError, ValueError):
                kind = getattr(action.type, "__name__", "")
                return f"invalid {kind} value {text!r}".replace("  ", " ")
        if action.choices is not None and converted not in action.choices:
            return f"invalid choice {text!r} (choose from {', '.join(map(str, action.choices))})"
    return None


def _resolve(value: IniValue, base: str, comma_list: bool) -> IniValue:
    """A relative path of the INI file made relative to its directory ``base``.  The value
    of a repeatable option may be a comma-separated list (signing.split_paths), each part
    a path; an empty value stays empty (unset)."""
    if isinstance(value, list):
        return [_resolve_one(one, base, comma_list) for one in value]
    return _resolve_one(value, base, comma_list)


def _resolve_one(value: str, base: str, comma_list: bool) -> str:
    parts = str(value).split(",") if comma_list else [str(value)]
    return ",".join(os.path.join(base, p.strip()) if p.strip() and not os.path.isabs(p.strip())
                    else p for p in parts)


def ini_options(actions: list[argparse.Action]) -> dict[str, argparse.Action]:
    """The INI keys of a parser's options (the long names without dashes) -> action: every
    option but help, version and the config file itself."""
    out: dict[str, argparse.Action] = {}
    for action in actions:
        if isinstance(action, (argparse._HelpAction, argparse._VersionAction)) or getattr(
                action, CONFIG_ATTR, False) or getattr(action, CLI_ONLY_ATTR, False):
            continue
        for option in action.option_strings:
            if option.startswith("--"):
                out[option[2:]] = action
    return out
