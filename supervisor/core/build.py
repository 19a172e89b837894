"""Which build is running: the release with the commit it was built from, ``0.1.0+g<12 hex>``
(a PEP 440 local version), or the plain release when the commit is unknown.  ``--version`` of
both commands, the worker's fleet record (``jobq-ctl workers``, the dashboard) and the schema
checks' refusals show it (any thread; computed once, on first use).

Where the commit comes from:

* An installed build (``pip install .``, scripts/install-service): setup.py's ``build_py``
  writes ``BUILT_FROM`` beside this module in the build -- never in the checkout -- holding the
  checkout's commit at build time (empty: unknown).
* An editable install (the dev and test venvs): no such file, so the checkout this module lies
  in is read at run time, when it is one (``.git`` two levels above ``supervisor/``).

A commit is read from the files under ``.git`` (HEAD, the loose ref, ``packed-refs``; a
worktree's ``.git`` file and its ``commondir``), without git and without a subprocess: both
commands start thousands of times in the tests and in cron jobs.  Only a layout those files do
not tell (a reftable repository) asks ``git rev-parse HEAD``.

setup.py loads this file on its own (``read_commit``) to bake the commit into a build, so its
top level imports nothing of the package.
"""

from __future__ import annotations

import argparse
import functools
import os
from collections.abc import Sequence
from typing import Any

BUILT_FROM = "BUILT_FROM"  # the file setup.py writes into the build, beside this module
HEX_DIGITS = frozenset("0123456789abcdef")
SHOWN = 12  # hex digits of the commit in the version (as ``git describe`` at this size)


@functools.cache
def version() -> str:
    """``0.1.0+g0123456789ab``, or ``0.1.0`` when the commit is unknown."""
    from .. import __version__  # at first use: setup.py loads this module without its package

    commit = build_commit()
    return f"{__version__}+g{commit[:SHOWN]}" if commit else __version__


def build_commit() -> str | None:
    """The commit this code was built from (an installed build) or is checked out at (an
    editable install), or None."""
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        with open(os.path.join(here, BUILT_FROM), encoding="ascii") as f:
            baked = f.read().strip()
        return baked if _is_name(baked) else None
    except FileNotFoundError:
        pass
    except (OSError, ValueError):
        return None
    return read_commit(os.path.dirname(os.path.dirname(here)))


def read_commit(root: str) -> str | None:
    """The commit HEAD names in the git checkout at ``root`` (a worktree too), or None when
    ``root`` is no checkout or git cannot tell."""
    try:
        git_dir = _git_dir(root)
    except (OSError, ValueError):
        return None
    if git_dir is None:
        return None
    try:
        return _from_files(git_dir)
    except (OSError, ValueError, LookupError):  # files it cannot read or a reftable
        return _from_git(root)


def _git_dir(root: str) -> str | None:
    dot_git = os.path.join(root, ".git")
    if os.path.isdir(dot_git):
        return dot_git
    if not os.path.isfile(dot_git):
        return None
    # a worktree or a submodule: ``gitdir: <path>``, relative to root when not absolute
    text = _read(dot_git)
    if not text.startswith("gitdir:"):
        return None
    return os.path.join(root, text.removeprefix("gitdir:").strip())


def _from_files(git_dir: str) -> str | None:
    head = _read(os.path.join(git_dir, "HEAD"))
    if _is_name(head):  # a detached HEAD
        return head
    if not head.startswith("ref:"):
        return None
    ref = head.removeprefix("ref:").strip()
    common = git_dir
    if os.path.isfile(os.path.join(git_dir, "commondir")):  # a worktree: refs are shared
        common = os.path.join(git_dir, _read(os.path.join(git_dir, "commondir")))
    for where in dict.fromkeys((git_dir, common)):
        try:
            name = _read(os.path.join(where, ref))
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            continue
        return name if _is_name(name) else None
    try:
        with open(os.path.join(common, "packed-refs"), encoding="utf-8") as f:
            for line in f:
                name, _, packed = line.rstrip("\n").partition(" ")
                if packed == ref and _is_name(name):
                    return name
    except FileNotFoundError:
        pass
    if os.path.isdir(os.path.join(common, "reftable")):
        raise LookupError("refs in a reftable: git reads them")
    return None  # a branch with no commit yet


def _from_git(root: str) -> str | None:
    """``git rev-parse HEAD``: the rare layout the files did not tell (no git: None)."""
    import subprocess  # only here: the usual start reads files

    try:
        done = subprocess.run(["git", "-C", root, "rev-parse", "HEAD"], capture_output=True,
                              text=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    name = done.stdout.strip()
    return name if done.returncode == 0 and _is_name(name) else None


def _is_name(text: str) -> bool:
    """A SHA-1 or SHA-256 object name (no regex: compiling one costs every start)."""
    return len(text) in (40, 64) and HEX_DIGITS.issuperset(text)


def _read(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        return f.read(4096).strip()


class VersionAction(argparse.Action):
    """``--version``: prints ``<prog> <version()>`` and exits 0.  argparse's own action takes
    the text when the parser is built, on every start; this one reads the commit only when
    asked."""

    def __init__(self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS,
                 default: Any = argparse.SUPPRESS, help: str | None = None) -> None:
        super().__init__(option_strings, dest=dest, default=default, nargs=0,
                         help=help or "show the version (with the build's commit) and exit")

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        print(f"{parser.prog} {version()}", flush=True)  # stdout, as argparse's own
        parser.exit()
