"""The options reference of ``jobq-supervisor`` and ``jobq-ctl``, read from their real parsers
(``supervisor.worker.main.worker_parser``, ``supervisor.ctl.main.ctl_parser``) and written as
reStructuredText.

Pure: no Sphinx here (jobq_reference.py is the Sphinx side), so the unit tests
(tests/unit/test_reference.py) check this very text without Sphinx installed.  Building a
parser has no side effect: it reads no environment, no file, starts nothing.

Each option: its flags, its help, its INI key (the long name without dashes, as
core/config_file.py's ``ini_options`` gives it), its environment variable (configargparse's
own rule: the parser's ``auto_env_var_prefix`` and its first config key, ``-`` -> ``_``, upper
case) and its default in the form the option accepts (``10m``, ``64M``, ``126,127``).
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from dataclasses import dataclass

from supervisor.core.config_file import CLI_ONLY_ATTR, CONFIG_ATTR, ini_options
from supervisor.core.options import _duration, _size
from supervisor.core.settings import format_duration
from supervisor.core.sizes import format_size
from supervisor.ctl.main import ctl_parser
from supervisor.worker.main import worker_parser

COMMANDS = ("jobq-supervisor", "jobq-ctl")
# core/options.py: configargparse reads no variable for the config file; _with_env_config does
CONFIG_ENV = "JOBQ_CONFIG"
UNSET = "unset"
ACTION = "(an action)"  # --version: it takes no value, so has no default


@dataclass(frozen=True)
class Option:
    """One documented option (or positional argument) of one parser."""

    flags: str          # the option directive's signature: ``-n N, --num-workers N``
    help: str
    ini_key: str | None
    env_var: str | None
    default: str        # as the option would accept it; UNSET when there is none


def parser_of(command: str) -> argparse.ArgumentParser:
    """A fresh parser of ``command`` (one of COMMANDS)."""
    return worker_parser() if command == "jobq-supervisor" else ctl_parser()


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """``jobq-ctl``'s sub-command parsers by name, in the order they were added."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def documented(parser: argparse.ArgumentParser) -> Iterator[argparse.Action]:
    """The actions a user sees: all but --help, hidden ones and the sub-command slot."""
    for action in parser._actions:
        if (action.help == argparse.SUPPRESS or isinstance(action, argparse._HelpAction)
                or isinstance(action, argparse._SubParsersAction)):
            continue
        yield action


def missing_help(parser: argparse.ArgumentParser) -> list[str]:
    """``prog: option`` of every documented option of ``parser`` and its sub-commands that
    has no help text."""
    out = [f"{parser.prog}: {'/'.join(a.option_strings) or a.dest}"
           for a in documented(parser) if not (a.help or "").strip()]
    for sub in subcommands(parser).values():
        out += missing_help(sub)
    return out


def env_var(parser: argparse.ArgumentParser, action: argparse.Action) -> str | None:
    """The variable configargparse reads for ``action`` (parse_known_args sets it the same
    way, only at parse time), or None."""
    if getattr(action, CONFIG_ATTR, False):
        return CONFIG_ENV
    if getattr(action, CLI_ONLY_ATTR, False):  # --check-config: the command line only
        return None
    prefix = getattr(parser, "_auto_env_var_prefix", None)
    given = getattr(action, "env_var", None)  # set by hand, or by an earlier parse
    if given:
        return str(given)
    if prefix is None or not action.option_strings or isinstance(
            action, (argparse._VersionAction, argparse._HelpAction)):
        return None
    keys = parser.get_possible_config_keys(action)  # type: ignore[attr-defined]
    if not keys:
        return None
    return f"{prefix}{keys[0].strip(parser.prefix_chars)}".replace("-", "_").upper()


def show_default(action: argparse.Action) -> str:
    """``action``'s default in a form the option accepts (parsed back by the tests)."""
    value = action.default
    if isinstance(action, argparse._VersionAction):
        return ACTION
    if action.nargs == 0:  # a switch
        return "true" if value is True else "false"
    if value is None or value is argparse.SUPPRESS or value in ((), [], ""):
        return UNSET
    if action.type is _duration and isinstance(value, (int, float)):
        return format_duration(float(value))
    if action.type is _size and isinstance(value, int):
        return format_size(value)
    if isinstance(value, (tuple, list)):
        return ",".join(str(v) for v in value)
    return str(value)


def _signature(action: argparse.Action) -> str:
    """``-n N, --num-workers N`` (argparse's metavar), or a positional's name."""
    if not action.option_strings:
        metavar = action.metavar or action.dest
        return str(metavar).upper()
    if action.nargs == 0:
        return ", ".join(action.option_strings)
    metavar = action.metavar or (action.dest.upper() if action.choices is None
                                 else "{" + ",".join(map(str, action.choices)) + "}")
    return ", ".join(f"{flag} {metavar}" for flag in action.option_strings)


def options(parser: argparse.ArgumentParser, own_ini: bool) -> list[Option]:
    """The documented options of ``parser``; ``own_ini``: it reads an INI file (a top-level
    parser; sub-commands read no INI file and no variable)."""
    keys = {id(a): k for k, a in ini_options(parser._actions).items()} if own_ini else {}
    return [Option(flags=_signature(a), help=(a.help or "").strip(), ini_key=keys.get(id(a)),
                   env_var=env_var(parser, a) if own_ini else None, default=show_default(a))
            for a in documented(parser)]


def escape(text: str) -> str:
    """Help text as reST text: none of its characters is markup."""
    for char in "\\*`|_":
        text = text.replace(char, "\\" + char)
    return text


def _option_rst(option: Option) -> list[str]:
    kind = "option" if option.flags.startswith("-") else "describe"
    lines = [f".. {kind}:: {option.flags}", "", f"   {escape(option.help)}", ""]
    facts = []
    if option.ini_key is not None or option.env_var is not None:
        facts += [f"INI key: {_literal(option.ini_key)}",
                  f"environment: {_literal(option.env_var)}"]
    # an unset default the help text explains ("default: the worker's ...") is not repeated
    if option.default != ACTION and not (option.default == UNSET and "default" in option.help):
        facts.append(f"default: {_literal(None if option.default == UNSET else option.default)}")
    if facts:
        lines += ["   " + "; ".join(facts) + ".", ""]
    return lines


def _literal(text: str | None) -> str:
    return "none" if text is None else f"``{text}``"


def _usage(parser: argparse.ArgumentParser) -> list[str]:
    """argparse's usage lines without their ``usage: `` (the heading says it)."""
    first, *rest = parser.format_usage().rstrip().splitlines()
    cut = len("usage: ")
    lines = [first[cut:], *(line[cut:] if line[:cut].isspace() else line for line in rest)]
    return [".. code-block:: text", "", *("   " + line for line in lines), ""]


def _heading(text: str, char: str) -> list[str]:
    return [text, char * len(text), ""]


def render(command: str, description: list[str] = []) -> str:  # noqa: B006 (not mutated)
    """The reference of ``command`` (COMMANDS) as reST, with ``-`` and ``~`` headings: its
    usage, its description (the parser's, then the lines of reST ``description``), its
    options, and (jobq-ctl) each sub-command's usage and own options."""
    parser = parser_of(command)
    lines = _heading("Synopsis", "-") + _usage(parser)
    lines += _heading("Description", "-") + [escape(parser.description or ""), ""]
    lines += [*description, ""]
    lines += _heading("Options", "-") + [f".. program:: {command}", ""]
    for option in options(parser, own_ini=True):
        lines += _option_rst(option)
    subs = subcommands(parser)
    if subs:
        lines += _heading("Commands", "-")
        top = {flag for a in documented(parser) for flag in a.option_strings}
        for name, sub in subs.items():
            program = f"{command} {name}"
            lines += _heading(name, "~") + _usage(sub) + [escape(sub.description or ""), ""]
            own = [o for a, o in zip(documented(sub), options(sub, own_ini=False))
                   if not (a.default is argparse.SUPPRESS and set(a.option_strings) <= top)]
            shared = sorted({flag for a in documented(sub) for flag in a.option_strings
                             if a.default is argparse.SUPPRESS and flag in top
                             and flag.startswith("--")})
            lines += [f".. program:: {program}", ""]
            for option in own:
                lines += _option_rst(option)
            if shared:
                refs = ", ".join(f":option:`{command} {flag}`" for flag in shared)
                lines += [f"Also takes these options of ``{command}`` after the command "
                          f"name: {refs}.", ""]
    return "\n".join(lines) + "\n"
