"""Where the ``--config`` file is named on a command line, read by our own rules (main thread,
before the parse).

configargparse up to 1.9 looked for its config file flag anywhere on the command line; 1.10
reads only the arguments before a sub-command (argparse hands the rest to the sub-parser,
which may give the same flag another meaning) and, to find it, builds a second parser that
imports shutil, bz2 and lzma on every start.  So the flag is an ordinary option of ours
(``CONFIG_ATTR``), the file is found here and its text handed to configargparse
(``config_file_contents``, in every release): what ``jobq-ctl status --config FILE`` means no
longer depends on the release.  argparse's own rules decide what is an option and what is an
option's value, so ``push -c 'x --config y'`` names no file.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator

from .config_file import CONFIG_ATTR


def config_before_command(parser: argparse.ArgumentParser, argv: list[str]) -> list[str]:
    """``argv`` with every config file flag that follows the sub-command (and its value) moved
    to just before the sub-command, in order (the last one still wins), where the parser
    itself reads it.  Unchanged when the parser has no sub-commands, none is found, or the
    line is one argparse will refuse (its own error comes from the parse)."""
    commands = _commands(parser)
    if commands is None:
        return argv
    at = next((i for i, action, _ in _options(parser, argv, commands) if action is None), None)
    if at is None:
        return argv
    sub = commands[argv[at]]
    moved, rest = [], []
    i = at + 1
    while i < len(argv):
        arg = argv[i]
        if arg == "--":  # what follows is positional, whatever it looks like
            rest.extend(argv[i:])
            break
        action = _action(sub, arg.partition("=")[0]) if arg.startswith("--") else None
        if action is not None and _names_the_config(parser, action):
            width = 1 if "=" in arg else 2
            moved.extend(argv[i:i + width])
            i += width
            continue
        rest.append(arg)
        i += 1
    if not moved:
        return argv
    return [*argv[:at], *moved, argv[at], *rest]


def config_path(parser: argparse.ArgumentParser, argv: list[str]) -> str | None:
    """The file the parser's config flag names before any sub-command (the last one given),
    or None."""
    path = None
    for _, action, value in _options(parser, argv, _commands(parser)):
        if action is not None and getattr(action, CONFIG_ATTR, False):
            path = value
    return path


def _commands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser] | None:
    action = next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)),
                  None)
    return None if action is None else action.choices


def _names_the_config(parser: argparse.ArgumentParser, action: argparse.Action) -> bool:
    """Whether ``action`` (of a sub-parser) is spelled as the parser's config flag."""
    own = next((a for a in parser._actions if getattr(a, CONFIG_ATTR, False)), None)
    return own is not None and set(action.option_strings) <= set(own.option_strings)


def _options(parser: argparse.ArgumentParser, argv: list[str],
             commands: dict[str, argparse.ArgumentParser] | None,
             ) -> Iterator[tuple[int, argparse.Action | None, str | None]]:
    """argparse's reading of ``argv`` up to the sub-command: (index, action, value) of each
    option that takes one value, then (index of the sub-command, None, None).  Stops at
    anything it cannot read for sure (an unknown option, a variable number of values, ``--``,
    a positional that is no sub-command)."""
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            return
        if not arg.startswith("-") or arg == "-":
            if commands is not None and arg in commands:
                yield i, None, None
            return
        name, eq, attached = arg.partition("=")
        short = not arg.startswith("--") and len(arg) > 2 and not eq
        action = _action(parser, arg[:2] if short else name)
        if action is None:
            return
        if action.nargs == 0:
            i += 1
            continue
        if action.nargs is not None:
            return
        if eq or short:
            yield i, action, attached if eq else arg[2:]
            i += 1
        else:
            yield i, action, argv[i + 1] if i + 1 < len(argv) else None
            i += 2


def _action(parser: argparse.ArgumentParser, name: str) -> argparse.Action | None:
    """The action argparse takes ``name`` for: the option itself, or the one long option it
    is an unambiguous prefix of (``allow_abbrev``)."""
    exact = next((a for a in parser._actions if name in a.option_strings), None)
    if exact is not None or not parser.allow_abbrev or not name.startswith("--"):
        return exact
    matches = [a for a in parser._actions
               if any(s.startswith(name) and s.startswith("--") for s in a.option_strings)]
    return matches[0] if len(matches) == 1 else None
