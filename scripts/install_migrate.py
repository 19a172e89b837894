"""Carry an older install's settings over to this release (scripts/install-service runs it with
the new venv's Python, before it replaces the unit).

Installs from before the configuration file became the one source of the service's queue
(releases up to 2026-11-26) had a unit that set ``Environment=JOBQ_SQLITE_PATH=/var/lib/jobq/
jobq.db``, and a worker.ini whose relative paths (``sqlite-path = jobq.db``) meant the working
directory's.  Today's unit sets no JOBQ_ variable, and a relative path in the file is relative
to the file's directory; kept as they were, the service would look for /etc/jobq/jobq.db
(which it may not write: exit 2, not restarted) and ``jobq-ctl --config`` would create one
there.  So, when the installed unit sets JOBQ_ variables:

* each JOBQ_<NAME>=VALUE of the unit becomes ``name = VALUE`` in the file (the value the
  service ran with: the environment beat the file);
* each other relative path in the file becomes absolute against the unit's
  WorkingDirectory= (what the old builds resolved it against).

The old file is kept beside the new one (``worker.ini.before-upgrade``, or with a time stamp
when that exists), and each change is one line on stdout.  Nothing to change: nothing written.
Exit status 0, or 2 with one line when the file cannot be read or written.

usage: install_migrate.py --unit OLD_UNIT --config WORKER_INI
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import sys
import time
from pathlib import Path

SECTION = "jobq-supervisor"
DEFAULT_WORKDIR = "/var/lib/jobq"
_KEY = re.compile(r"^(\s*)([A-Za-z0-9_-]+)(\s*[=:]\s*)(.*?)(\s*)$")


def unit_environment(text: str) -> tuple[dict[str, str], str]:
    """The JOBQ_ variables a unit's [Service] sets (Environment= lines, systemd's quoting)
    and its WorkingDirectory= (or the shipped one's)."""
    env: dict[str, str] = {}
    workdir = DEFAULT_WORKDIR
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("Environment="):
            for word in shlex.split(line[len("Environment="):]):
                name, sep, value = word.partition("=")
                if sep and name.startswith("JOBQ_"):
                    env[name] = value
        elif line.startswith("WorkingDirectory="):
            value = line[len("WorkingDirectory="):].strip().lstrip("-")
            if value.startswith("/"):
                workdir = value
    return env, workdir


def option_keys() -> tuple[set[str], set[str]]:
    """The worker's INI keys, and those that are paths (the installed build's parser)."""
    from supervisor.core.config_file import PATH_ATTR, ini_options
    from supervisor.worker.main import worker_parser

    options = ini_options(worker_parser()._actions)
    return set(options), {k for k, a in options.items() if getattr(a, PATH_ATTR, False)}


def migrate(ini: str, env: dict[str, str], workdir: str, keys: set[str],
            paths: set[str]) -> tuple[str, list[str]]:
    """The file's new text and one line per change (``env``: the old unit's JOBQ_
    variables).  Only the [jobq-supervisor] section is read; comments stay as they are."""
    origin = {name[len("JOBQ_"):].lower().replace("_", "-"): name for name in env}
    notes = [f"the old unit's {name} is not an option of this release; dropped"
             for key, name in origin.items() if key not in keys]
    wanted = {key: _absolute(env[name], workdir) if key in paths else env[name]
              for key, name in origin.items() if key in keys}
    lines = ini.splitlines()
    out: list[str] = []
    section = None
    section_end = None
    seen: set[str] = set()
    for line in lines:
        stripped = line.strip()
        if stripped.startswith("[") and stripped.endswith("]"):
            if section == SECTION:
                section_end = len(out)
            section = stripped[1:-1].strip()
            out.append(line)
            continue
        m = _KEY.match(line)
        if section != SECTION or m is None or stripped.startswith(("#", ";")):
            out.append(line)
            continue
        indent, key, sep, value, _ = m.groups()
        if key in wanted:
            seen.add(key)
            if value != wanted[key]:
                notes.append(f"{key} = {value} -> {wanted[key]} (the old unit's "
                             f"{origin[key]})")
            line = f"{indent}{key}{sep}{wanted[key]}"
        elif key in paths and (new := _absolute(value, workdir)) != value:
            notes.append(f"{key} = {value} -> {new} (relative to the old unit's working "
                         f"directory)")
            line = f"{indent}{key}{sep}{new}"
        out.append(line)
    if section == SECTION:
        section_end = len(out)
    missing = [k for k in wanted if k not in seen]
    if missing:
        if section_end is None:
            out += ["", f"[{SECTION}]"]
            section_end = len(out)
        added = [f"{k} = {wanted[k]}" for k in missing]
        for k in missing:
            notes.append(f"{k} = {wanted[k]} added (the old unit's {origin[k]})")
        out[section_end:section_end] = added
    return "\n".join(out) + "\n", notes


def _absolute(value: str, workdir: str) -> str:
    """``value`` (a path, or a comma-separated list of them) with each relative path made
    absolute against ``workdir``; unchanged when none is relative."""
    parts = [p.strip() for p in value.split(",")]
    if all(not p or p.startswith(("/", "~")) for p in parts):
        return value
    return ", ".join(p if not p or p.startswith(("/", "~")) else os.path.join(workdir, p)
                     for p in parts)


def backup_path(config: Path) -> Path:
    first = config.with_name(config.name + ".before-upgrade")
    if not first.exists():
        return first
    return config.with_name(f"{config.name}.before-upgrade-{time.strftime('%Y%m%d%H%M%S')}")


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="install_migrate.py")
    p.add_argument("--unit", required=True, type=Path)
    p.add_argument("--config", required=True, type=Path)
    args = p.parse_args(argv)
    try:
        unit = args.unit.read_text() if args.unit.exists() else ""
        ini = args.config.read_text(encoding="utf-8")
    except OSError as exc:
        print(f"install-service: cannot read {exc.filename}: {exc.strerror}", file=sys.stderr)
        return 2
    except UnicodeDecodeError:
        print(f"install-service: {args.config} is not UTF-8 text", file=sys.stderr)
        return 2
    env, workdir = unit_environment(unit)
    if not env:  # a unit of this release's kind, or none: the file means what it says
        return 0
    keys, paths = option_keys()
    text, notes = migrate(ini, env, workdir, keys, paths)
    if text == ini:
        return 0
    backup = backup_path(args.config)
    try:
        mode = args.config.stat().st_mode & 0o7777
        backup.write_text(ini, encoding="utf-8")
        os.chmod(backup, mode)
        tmp = args.config.with_name(args.config.name + ".new")
        tmp.write_text(text, encoding="utf-8")
        os.chmod(tmp, mode)
        os.replace(tmp, args.config)
    except OSError as exc:
        print(f"install-service: cannot write {exc.filename}: {exc.strerror}", file=sys.stderr)
        return 2
    for note in notes:
        print(f"install-service: {args.config}: {note}")
    print(f"install-service: the file as it was: {backup}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
