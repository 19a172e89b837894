"""Command-line usage shared by both commands (worker/main.py builds the parsers,
ctl/commands.py dispatches the
sub-commands): the parser class with its one-line errors and help format, ``JOBQ_CONFIG``
and the INI file (core/config_file.py), the option value types, the Settings built from them, and
UsageError (main thread)."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import fields
from functools import partial
from typing import Any, NoReturn

import configargparse

from .backend_choice import GivenStore, Sources, choose_backend, given_options
from .config_file import CLI_ONLY_ATTR, CONFIG_ATTR, PATH_ATTR, IniFile, ini_options
from .config_flag import config_before_command, config_path
from .settings import (
    BACKENDS,
    CONTROL_MODES,
    EXIT_USAGE,
    POSTGRES_NOTIFY_MODES,
    Settings,
    SettingsError,
    parse_duration,
)
from .sizes import parse_size


class UsageError(Exception):
    """Bad command line or configuration: one line on stderr, exit status 2."""


# The default of every option that sets a Settings field is that field's default: one copy.
SETTINGS_DEFAULTS: dict[str, object] = {f.name: f.default for f in fields(Settings)}


EPILOG = ("Every option with -- is also a key of the --config INI file (the name without the "
          "dashes) and an environment variable JOBQ_<NAME>; precedence: flag > environment > "
          "config file > default.  A relative path in the config file is relative to the file's "
          "directory; on the command line and in the environment, to the working directory.")


def _columns() -> int:
    """``shutil.get_terminal_size().columns``: $COLUMNS, else the terminal's, else 80."""
    try:
        columns = int(os.environ["COLUMNS"])
    except (KeyError, ValueError):
        columns = 0
    if columns <= 0:
        try:  # sys.__stdout__ may be None (AttributeError), as shutil allows for
            columns = os.get_terminal_size(sys.__stdout__.fileno()).columns  # type: ignore[union-attr]
        except (AttributeError, ValueError, OSError):
            columns = 0
    return columns or 80


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows a default once: not when the help text already names it, nor an empty one."""

    def __init__(self, prog: str, indent_increment: int = 2, max_help_position: int = 24,
                 width: int | None = None) -> None:
        # argparse makes one per option and asks shutil for the width, and importing shutil
        # imports bz2 and lzma: ~3 ms of each jobq-ctl start-up for the same number
        super().__init__(prog, indent_increment, max_help_position,
                         _columns() - 2 if width is None else width)

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if "default" in text or action.default in (None, False, [], "", argparse.SUPPRESS):
            return text
        return super()._get_help_string(action)


class _Parser(configargparse.ArgParser):
    """argparse prints usage plus the message; we want exactly one line.  An option without
    an explicit default takes its Settings field's.  ``add_argument(..., path=True)``: a
    file or directory, relative to the config file's directory when given there.  The INI
    file's keys are those of ``ini_owner()`` (jobq-ctl: the worker's parser) and its own."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # configargparse's own epilog points at a URL shortener; ours is EPILOG
        kwargs.setdefault("epilog", EPILOG)
        self.ini_owner: Callable[[], argparse.ArgumentParser] | None = None
        made: list[IniFile] = []
        options = self._ini_options

        class _OwnIni(IniFile):
            # configargparse makes its INI parser from a class, with no arguments (its
            # documented way); this one reads the keys of this parser's options
            def __init__(ini) -> None:
                super().__init__(options)
                made.append(ini)

        # the width once per parser, not once per option (argparse makes a formatter for each)
        super().__init__(*args, add_config_file_help=False, add_env_var_help=False,
                         formatter_class=partial(_HelpFormatter, width=_columns() - 2),
                         config_file_parser_class=_OwnIni, **kwargs)
        self.ini_file = made[0]

    def _ini_options(self) -> dict[str, argparse.Action]:
        own = ini_options(self._actions)
        return {**own, **ini_options(self.ini_owner()._actions)} if self.ini_owner else own

    def settings(self, ns: argparse.Namespace) -> Settings:
        """``Settings`` of the parsed ``ns``, on the backend its options name
        (core/backend_choice.py); a value it refuses that came from the INI file is named by
        file, line and key (UsageError)."""
        try:
            ns.backend = choose_backend(ns, Sources(
                self.get_source_to_settings_dict(), self.ini_file.origins, given_options(ns)))
            return Settings.from_namespace(ns)
        except SettingsError as exc:
            if exc.option is not None and exc.option in self._from_ini():
                name, line = self.ini_file.origins[exc.option]
                raise UsageError(f"{name} line {line}: {exc.option}: {exc.problem}") from None
            raise UsageError(str(exc)) from None

    def _from_ini(self) -> set[str]:
        """The INI keys whose values this parse took (not overridden by env or flag)."""
        return {key for source, values in self.get_source_to_settings_dict().items()
                if source.startswith("config_file") for key in values}

    def command_line_only_env(self) -> set[str]:
        """The ``JOBQ_`` names configargparse would give the options of the command line only
        (``--check-config``): ``_parse`` hides them, as the INI file has no key for them."""
        prefix = getattr(self, "_auto_env_var_prefix", None) or ""
        return {f"{prefix}{o[2:]}".replace("-", "_").upper() for a in self._actions
                if getattr(a, CLI_ONLY_ATTR, False) for o in a.option_strings
                if o.startswith("--")}

    def format_help(self) -> str:
        for a in self._actions:
            env = getattr(a, "env_var", None)
            if getattr(a, CLI_ONLY_ATTR, False):
                continue
            if env and a.help != argparse.SUPPRESS and f"[env var: {env}]" not in (a.help or ""):
                a.help = f"{a.help or ''} [env var: {env}]"
        return argparse.ArgumentParser.format_help(self)

    def error(self, message: str) -> NoReturn:
        raise UsageError(message)

    def add_argument(self, *args: Any, **kwargs: Any) -> argparse.Action:
        path = kwargs.pop("path", False)
        cli_only = kwargs.pop("cli_only", False)
        action: argparse.Action = super().add_argument(*args, **kwargs)
        setattr(action, PATH_ATTR, path)
        setattr(action, CLI_ONLY_ATTR, cli_only)
        if "default" not in kwargs and action.dest in SETTINGS_DEFAULTS:
            action.default = SETTINGS_DEFAULTS[action.dest]
        return action


def _duration(text: str) -> float:
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _size(text: str) -> int:
    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid integer {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must not be negative: {text!r}")
    return value


def _exit_codes(text: str) -> tuple[int, ...]:
    """``126,127`` -> (126, 127); empty -> () (--no-retry-exit-codes)."""
    try:
        return tuple(sorted({int(part) for part in text.replace(" ", "").split(",") if part}))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected exit statuses separated by commas (e.g. 126,127), got {text!r}") from None


def _paths(text: str) -> tuple[str, ...]:
    """``/a,/b`` -> ("/a", "/b"): absolute paths or shell patterns (--allowed-cwd)."""
    paths = tuple(dict.fromkeys(p.strip() for p in text.split(",") if p.strip()))
    bad = [p for p in paths if not p.startswith("/") or "\x00" in p]
    if bad:
        raise argparse.ArgumentTypeError(
            f"expected absolute directories separated by commas, got {bad[0]!r}")
    return paths


def _umask(text: str) -> int:
    """``0022`` -> 0o022 (--task-umask): octal, as umask(1) takes it."""
    try:
        value = int(text, 8)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an octal umask such as 0022, got {text!r}") \
            from None
    if not 0 <= value <= 0o777:
        raise argparse.ArgumentTypeError(f"expected an octal umask from 0 to 0777, got {text!r}")
    return value


def _env_names(text: str) -> tuple[str, ...]:
    """``A,B`` -> ("A", "B"); empty -> () (--pass-env)."""
    names = tuple(dict.fromkeys(part for part in text.replace(" ", "").split(",") if part))
    bad = [n for n in names if "=" in n or "\x00" in n]
    if bad:
        raise argparse.ArgumentTypeError(
            f"expected variable names separated by commas (e.g. HF_TOKEN,DB_PASS), got {bad[0]!r}")
    return names


def _with_env_config(prog: str, argv: list[str], env: Mapping[str, str]) -> list[str]:
    """JOBQ_CONFIG as if given as ``--config`` (configargparse reads no env var for it), so a
    missing file is the same one-line exit 2; a ``--config`` flag wins.  jobq-ctl's ``-c`` is
    push's command, not the config file."""
    path = env.get("JOBQ_CONFIG")
    short = prog == "jobq-supervisor"
    given = any(a == "--config" or a.startswith("--config=")
                or (short and a.startswith("-c") and not a.startswith("--")) for a in argv)
    return ["--config", path, *argv] if path and not given else argv


def _parse(parser: _Parser, argv: list[str],
           env: Mapping[str, str] | None = None) -> argparse.Namespace:
    """``argv``, ``env`` (default: this process's environment) and the config file they
    name, parsed; a reload parses the start's argv and environment again (worker/reload.py)."""
    env = os.environ if env is None else env
    if hidden := parser.command_line_only_env() & env.keys():
        env = {k: v for k, v in env.items() if k not in hidden}
    argv = config_before_command(parser, _with_env_config(parser.prog, argv, env))
    path = config_path(parser, argv)
    text = None
    if path and not {"-h", "--help"} & set(argv):  # help reads no file, as before
        path = os.path.expanduser(path)
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except UnicodeDecodeError:
            raise UsageError(f"--config: {path} is not UTF-8 text") from None
        except OSError as exc:
            raise UsageError(f"--config: cannot read {path}: {exc.strerror}") from None
        parser.ini_file.path = path
    return parser.parse_args(argv, config_file_contents=text, env_vars=env)


def jobq_parser(prog: str, description: str, config_flags: list[str], config_help: str,
                **extra: object) -> _Parser:
    """A parser whose options are also ``JOBQ_<NAME>`` variables and INI keys (both
    commands; main thread)."""
    parser = _Parser(prog=prog, description=description, auto_env_var_prefix="JOBQ_",
                     **extra)
    # an option of ours, not configargparse's config file flag: _parse reads the file
    # (config_flag.py says why)
    action = parser.add_argument(*config_flags, dest="config_file", metavar="CONFIG_FILE",
                                 help=config_help)
    setattr(action, CONFIG_ATTR, True)
    return parser


def add_backend_options(p: argparse.ArgumentParser, suppress: bool = False) -> None:
    """Options shared by both commands (on jobq-ctl sub-commands with SUPPRESS defaults,
    so that they do not hide the values given before the sub-command)."""
    kw: dict[str, Any] = {"default": argparse.SUPPRESS} if suppress else {}
    # a backend's own options (and --backend) mark that they were given: backend_choice.py
    own = {**kw, "action": GivenStore}
    p.add_argument("--backend", choices=BACKENDS,
                   help="queue backend; without it, the one whose options are given "
                        "(--postgres-url: postgres), by default sqlite", **own)
    p.add_argument("--queue", help="queue name; a worker takes a comma-separated list "
                   "(high,default,low: see --queue-order); of jobq-ctl's commands only "
                   "status takes several", **kw)
    p.add_argument("--sqlite-path", help="SQLite database file", path=True, **own)
    p.add_argument("--connection-string",
                   help="Azure connection string (secret: prefer env JOBQ_CONNECTION_STRING)",
                   **own)
    p.add_argument("--account-url",
                   help="Storage account queue URL, with DefaultAzureCredential", **own)
    p.add_argument("--namespace",
                   help="Service Bus namespace NAME.servicebus.windows.net, with "
                        "DefaultAzureCredential", **own)
    p.add_argument("--postgres-url",
                   help="PostgreSQL: libpq connection string, URI or key=value, TLS by its "
                        "sslmode (secret when it holds a password: prefer env "
                        "JOBQ_POSTGRES_URL or ~/.pgpass); empty: libpq's PG* variables",
                   **own)
    p.add_argument("--postgres-schema",
                   help="PostgreSQL: the schema of jobq's tables (default jobq)", **own)
    p.add_argument("--postgres-notify", choices=POSTGRES_NOTIFY_MODES,
                   help="PostgreSQL: wake idle workers, and the control thread on a cancel, "
                        "pause, drain or stop, by LISTEN/NOTIFY (default on); off "
                        "behind PgBouncer in transaction mode (poll only, no prepared "
                        "statements)", **own)
    p.add_argument("--control", choices=CONTROL_MODES,
                   help="fleet control store (workers, cancels, pause, drain): auto = the "
                        "queue's SQLite file, or Table Storage in the Storage Queue's account "
                        "or at --control-account-url / JOBQ_CONTROL_CONNECTION_STRING; off",
                   **kw)
    p.add_argument("--control-account-url",
                   help="Storage account (table or queue URL) for the control store, with "
                        "DefaultAzureCredential (Service Bus has no account of its own)", **kw)
    p.add_argument("--control-connection-string",
                   help="Storage connection string for the control store (secret: prefer env "
                        "JOBQ_CONTROL_CONNECTION_STRING)", **kw)
    p.add_argument("--group-readable", action="store_true",
                   help="the files and directories created (SQLite queue, output store, task "
                        "logs) are readable by the group (0640/0750), not only by the user "
                        "(0600/0700)", **kw)
    p.add_argument("--task-log-container",
                   help="Azure: blob container of the output store, in the control store's "
                        "account", **kw)


def usage_failed(prog: str, message: str) -> int:
    """The one-line error of exit status 2 on stderr (main thread)."""
    print(f"{prog}: error: {message}", file=sys.stderr)
    return EXIT_USAGE
