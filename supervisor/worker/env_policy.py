"""What a message may set besides its command: environment variables and working directory.

An allow-list (``--allowed-commands``) and signatures promise that the command is the whole
story of what runs.  A message's environment and ``cwd`` can break that promise without touching
the command: ``BASH_ENV`` is expanded and run by every ``bash -c``, ``BASH_FUNC_echo%%`` replaces
``echo``, ``LD_PRELOAD`` loads a library into every program, ``PATH`` or ``PYTHONPATH`` picks
other programs, and an allowed ``bash job.sh`` runs whatever ``job.sh`` the message's ``cwd``
holds.  So, while either is in force, a variable whose name matches ``REFUSED`` (plus
``--refused-env``) is refused unless ``--allowed-env`` names it, and a ``cwd`` is refused unless
it matches ``--allowed-cwd`` (default: the worker's own directory).  Without an allow-list and
without signatures whoever writes to the queue chooses the command itself, so nothing is
refused.

Built once at start (``EnvPolicy.from_settings``, main thread); ``refusal`` runs on the main
thread for every task received.  docs/security.rst lists ``REFUSED``.
"""

from __future__ import annotations

import fnmatch
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

# Names that change what a shell, the loader or a common interpreter runs, or where a program
# looks for its code and configuration.  Shell patterns (fnmatch), matched case-sensitively.
REFUSED: tuple[str, ...] = (
    # bash and sh: start-up files, exported functions, options, expansion and tracing
    "BASH_ENV", "ENV", "BASH_FUNC_*", "SHELLOPTS", "BASHOPTS", "PS4", "IFS", "CDPATH",
    "GLOBIGNORE", "PROMPT_COMMAND", "BASH_XTRACEFD", "BASH_LOADABLES_PATH", "EXECIGNORE",
    "INPUTRC", "ZDOTDIR",
    # where programs and their configuration are found
    "PATH", "HOME", "XDG_CONFIG_HOME", "XDG_CONFIG_DIRS",
    # the dynamic loader and glibc
    "LD_*", "DYLD_*", "GCONV_PATH", "LOCPATH", "NLSPATH", "HOSTALIASES", "RESOLV_HOST_CONF",
    "MALLOC_*", "GLIBC_TUNABLES",
    # interpreters that load code named by a variable
    "PYTHON*", "PERL5*", "PERLLIB", "RUBY*", "GEM_*", "NODE_*", "JAVA_TOOL_OPTIONS",
    "_JAVA_OPTIONS", "JDK_JAVA_OPTIONS", "CLASSPATH", "LUA_*", "TCLLIBPATH", "R_PROFILE*",
    "R_ENVIRON*", "R_LIBS*", "JULIA_*",
    # programs that run a helper named by a variable
    "GIT_*", "SSH_ASKPASS", "SUDO_ASKPASS", "PAGER", "MANPAGER", "EDITOR", "VISUAL",
    "BROWSER", "LESSOPEN", "LESSCLOSE", "OPENSSL_CONF", "OPENSSL_ENGINES",
)

# Names a pattern above matches that only change how output is written or hashed: allowed
# without being named (ai4s-jobq's workers add PYTHONUNBUFFERED to a task they retry).
HARMLESS: frozenset[str] = frozenset({
    "PYTHONUNBUFFERED", "PYTHONHASHSEED", "PYTHONIOENCODING", "PYTHONUTF8",
    "PYTHONDONTWRITEBYTECODE", "PYTHONFAULTHANDLER", "NODE_ENV",
})


@dataclass(frozen=True)
class EnvPolicy:
    """The refused variable names and allowed working directories; immutable after start.
    The default (no allow-list, no keys) refuses nothing."""

    refused: re.Pattern[str] | None = None  # REFUSED and --refused-env; None: not enforced
    allowed: frozenset[str] = frozenset()
    allowed_patterns: tuple[str, ...] = ()
    cwd_patterns: tuple[str, ...] = ()

    @classmethod
    def from_settings(cls, enforced: bool, allowed_env: Sequence[str] = (),
                      refused_env: Sequence[str] = (), allowed_cwd: Sequence[str] = (),
                      own_dir: str | None = None) -> EnvPolicy:
        """The policy of a worker (main thread, at start; a worker without a fence compiles
        nothing).  ``own_dir`` (default: the current directory) is the one ``cwd`` allowed
        when ``allowed_cwd`` is empty."""
        if not enforced:
            return cls()
        refused = dict.fromkeys((*REFUSED, *refused_env))
        # A name the operator refuses on purpose is refused even if it looks harmless.
        exact = (HARMLESS - set(refused_env)) | frozenset(
            n for n in allowed_env if not _is_pattern(n))
        patterns = tuple(n for n in allowed_env if _is_pattern(n))
        dirs = tuple(os.path.realpath(d) if not _is_pattern(d) else d
                     for d in (allowed_cwd or (own_dir or os.getcwd(),)))
        return cls(refused=re.compile("|".join(fnmatch.translate(p) for p in refused)),
                   allowed=exact, allowed_patterns=patterns, cwd_patterns=dirs)

    def refusal(self, env: Mapping[str, str], cwd: str | None) -> str | None:
        """Why a message's ``env``/``cwd`` may not be used, or None (main thread)."""
        if self.refused is None:
            return None
        for name in env:
            if self.refused.fullmatch(name) and not self._allowed(name):
                return f"environment variable {name!r} not allowed (--allowed-env)"
        if cwd is not None and not self.cwd_allowed(cwd):
            return f"working directory {cwd!r} not allowed (--allowed-cwd)"
        return None

    def _allowed(self, name: str) -> bool:
        return name in self.allowed or any(fnmatch.fnmatchcase(name, p)
                                           for p in self.allowed_patterns)

    def cwd_allowed(self, cwd: str) -> bool:
        """``cwd``, symbolic links resolved, is one of the allowed directories or matches one
        of their patterns (``*`` also matches ``/``)."""
        real = os.path.realpath(cwd)
        return any(fnmatch.fnmatchcase(real, p) for p in self.cwd_patterns)


def _is_pattern(text: str) -> bool:
    return any(c in text for c in "*?[")
