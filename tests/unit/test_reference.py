"""Issue 31: the options reference (docs/_ext/jobq_options.py, built into docs/reference/ and
the man pages by scripts/docs) says what the parsers say, every option has help text, and
conf/worker.ini's keys and defaults are the worker parser's.  No Sphinx needed: the reference
text is checked as the generator writes it."""

from __future__ import annotations

import argparse
import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest

from supervisor.core.config_file import CLI_ONLY_ATTR, ini_options
from supervisor.core.options import _parse
from supervisor.ctl.commands import COMMANDS
from supervisor.ctl.main import ctl_parser
from supervisor.worker.main import parse_worker_settings, worker_parser

REPO = Path(__file__).resolve().parents[2]
WORKER_INI = REPO / "conf" / "worker.ini"
# Keys conf/worker.ini sets to a value other than the default, on purpose (a line saying why
# is above each in the file).
# sqlite-path: the service's StateDirectory, /var/lib/jobq; task-umask: the tasks keep 0022
# under the service's UMask=0077
SET_ON_PURPOSE = {"sqlite-path", "task-umask"}
# conf/worker-postgres.ini: a PostgreSQL host's keys, set to what such a host runs with
POSTGRES_INI = REPO / "conf" / "worker-postgres.ini"
SET_FOR_POSTGRES = {"backend", "postgres-url", "num-workers"}


def _generator() -> ModuleType:
    """docs/_ext/jobq_options.py, loaded from its file (docs/ is not a package)."""
    spec = importlib.util.spec_from_file_location("jobq_options",
                                                  REPO / "docs" / "_ext" / "jobq_options.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("jobq_options", module)
    spec.loader.exec_module(module)
    return module


gen = _generator()


def _visible(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in parser._actions if a.help != argparse.SUPPRESS
            and not isinstance(a, (argparse._HelpAction, argparse._SubParsersAction))]


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    return {name: sub for a in parser._actions if isinstance(a, argparse._SubParsersAction)
            for name, sub in a.choices.items()}


def _env_vars_configargparse_reads(parser: argparse.ArgumentParser,
                                   argv: list[str]) -> dict[str, str]:
    """long flag -> the variable configargparse reads for it: it names them while parsing,
    so parse (nothing from the environment, no INI file).  An option of the command line
    only has none: core/options.py's ``_parse`` hides its name."""
    parser.parse_known_args(argv, env_vars={}, config_file_contents="")
    return {a.option_strings[-1]: a.env_var for a in parser._actions
            if getattr(a, "env_var", None) and not getattr(a, CLI_ONLY_ATTR, False)}


def _block(text: str, directive: str, signature_start: str) -> str:
    """The body of the first ``.. <directive>:: <signature_start>...`` in ``text``."""
    match = re.search(rf"^\.\. {directive}:: {re.escape(signature_start)}(?:[ ,].*)?\n"
                      rf"((?:\n|   .*\n)*)", text, re.MULTILINE)
    assert match, f"no '.. {directive}:: {signature_start}' in the reference"
    return match.group(1)


def _parsed_default(action: argparse.Action, shown: str) -> object:
    """The default the reference shows, read back the way the option reads a value."""
    if action.nargs == 0:
        return shown == "true"
    return action.type(shown) if callable(action.type) else shown


def _check_options(text: str, parser: argparse.ArgumentParser, env: dict[str, str],
                   shared: set[str]) -> None:
    keys = {id(a): k for k, a in ini_options(parser._actions).items()} if env else {}
    for action in _visible(parser):
        if action.default is argparse.SUPPRESS and set(action.option_strings) <= shared:
            continue  # a top-level option repeated after the command: listed by name
        first = action.option_strings[0] if action.option_strings else None
        body = _block(text, "option" if first else "describe",
                      first or str(action.metavar or action.dest).upper())
        assert (action.help or "").split()[0] in body, (first, body)
        if first in ("--version",):
            continue
        shown = re.search(r"default: (?:``(.*?)``|none)\.", body)
        if shown is None:  # the help text says what the default is
            assert action.default in (None, "", (), [], argparse.SUPPRESS), (first, body)
            assert "default" in action.help, (first, body)
        elif shown.group(1) is None:
            assert action.default in (None, "", (), [], argparse.SUPPRESS), (first, body)
        else:
            assert _parsed_default(action, shown.group(1)) == action.default, (first, body)
        long = action.option_strings[-1] if action.option_strings else None
        if long in env:
            assert f"environment: ``{env[long]}``" in body, (first, body)
        if id(action) in keys:
            assert f"INI key: ``{keys[id(action)]}``" in body, (first, body)


def test_reference_of_the_worker_covers_every_option_with_env_and_default():
    text = gen.render("jobq-supervisor")
    env = _env_vars_configargparse_reads(worker_parser(), [])
    assert len(env) > 50  # the walk saw the options
    _check_options(text, worker_parser(), env, set())
    assert "environment: ``JOBQ_CONFIG``" in _block(text, "option", "-c CONFIG_FILE")


def test_reference_of_jobq_ctl_covers_every_command_and_option():
    text = gen.render("jobq-ctl")
    parser = ctl_parser()
    env = _env_vars_configargparse_reads(ctl_parser(), ["size"])
    _check_options(text, parser, env, set())
    top = {flag for a in _visible(parser) for flag in a.option_strings}
    commands = text.split("\nCommands\n--------\n", 1)[1]
    for name, sub in _subparsers(parser).items():
        section = re.search(rf"^{re.escape(name)}\n~+\n(.*?)(?=^\S+\n~+\n|\Z)", commands,
                            re.MULTILINE | re.DOTALL)
        assert section, f"no section for jobq-ctl {name}"
        _check_options(section.group(1), sub, {}, top)
        for action in _visible(sub):
            if action.default is argparse.SUPPRESS and set(action.option_strings) <= top:
                long = action.option_strings[-1]
                assert f":option:`jobq-ctl {long}`" in section.group(1), (name, long)
    assert set(_subparsers(parser)) == set(COMMANDS)  # the walk saw every command


def test_every_option_has_help():
    assert gen.missing_help(worker_parser()) == []
    assert gen.missing_help(ctl_parser()) == []


def test_an_option_without_help_is_found():
    """The check above can fail: an option without help, at the top or in a command."""
    parser = ctl_parser()
    parser.add_argument("--quiet-one")
    _subparsers(parser)["push"].add_argument("--another", help=" ")
    assert gen.missing_help(parser) == ["jobq-ctl: --quiet-one", "jobq-ctl push: --another"]


def test_help_text_is_not_markup():
    """Help text goes into reST as text: ``JOBQ_`` is not a link target, ``*`` no emphasis."""
    assert gen.escape("not the JOBQ_ variables, *all* `x` |y|") == (
        "not the JOBQ\\_ variables, \\*all\\* \\`x\\` \\|y\\|")


# -- conf/worker.ini -------------------------------------------------------------------

def _ini_lines(text: str) -> list[tuple[int, bool, str, str]]:
    """(line number, commented out, key, value) of every ``key = value`` line, also of the
    ``# key = value`` examples."""
    out = []
    for number, line in enumerate(text.splitlines(), 1):
        match = re.fullmatch(r"(#\s*)?([a-z][a-z0-9-]*)\s*=\s*(.*?)\s*", line)
        if match:
            out.append((number, bool(match.group(1)), match.group(2), match.group(3)))
    return out


def ini_problems(text: str, on_purpose: frozenset[str] = frozenset()) -> list[str]:
    """What in a worker.ini text is not the worker parser's: a key that is no option, a set
    value that is not the option's default, a commented-out value that is not its default
    (when the option has one: otherwise the line is an example)."""
    options = ini_options(worker_parser()._actions)
    problems = []
    for number, commented, key, value in _ini_lines(text):
        action = options.get(key)
        if action is None:
            problems.append(f"line {number}: {key} is no option of jobq-supervisor")
            continue
        if key in SET_ON_PURPOSE or key in on_purpose:
            continue
        has_default = action.default not in (None, "", (), [], argparse.SUPPRESS)
        if commented and not has_default:
            continue
        if action.nargs == 0:
            read: object = value.lower() in ("true", "yes", "on", "1")
        elif value == "":
            read = None
        else:
            read = action.type(value) if callable(action.type) else value
        default = None if not has_default else action.default
        if read != default:
            problems.append(f"line {number}: {key} = {value}, but its default is "
                            f"{gen.show_default(action)}")
    return problems


def test_worker_ini_keys_and_defaults_are_the_parsers():
    text = WORKER_INI.read_text()
    assert len(_ini_lines(text)) > 50
    assert ini_problems(text) == []


def test_postgres_worker_ini_keys_and_defaults_are_the_parsers():
    """Issue 41 (7): the PostgreSQL example is checked like the SQLite one, and both commands
    read it as a PostgreSQL configuration."""
    text = POSTGRES_INI.read_text()
    assert ini_problems(text, frozenset(SET_FOR_POSTGRES)) == []
    settings = parse_worker_settings(["--config", str(POSTGRES_INI)])
    assert (settings.backend, settings.num_workers) == ("postgres", 4)
    assert settings.postgres_url.startswith("postgresql://jobq_worker@")
    ns = _parse(ctl_parser(), ["--config", str(POSTGRES_INI), "status"])
    assert (ns.backend, ns.postgres_schema) == ("postgres", "jobq")


def test_worker_ini_check_finds_a_wrong_key_and_a_wrong_default():
    assert ini_problems("[jobq-supervisor]\nkill-timout = 10m\n# retry-delay = 20\n"
                        "max-attempts = 5\n# task-user = jobq\n") == [
        "line 2: kill-timout is no option of jobq-supervisor",
        "line 3: retry-delay = 20, but its default is 10s"]


@pytest.mark.parametrize("command", ["jobq-supervisor", "jobq-ctl"])
def test_reference_help_matches_the_parsers_help(command):
    """Each help text of the reference is the one ``--help`` prints (argparse's own)."""
    parser = worker_parser() if command == "jobq-supervisor" else ctl_parser()
    text = gen.render(command)
    for action in _visible(parser):
        assert gen.escape(action.help.strip()) in text, action.option_strings
