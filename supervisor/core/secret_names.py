"""Which inherited environment variables are the worker's secrets, kept from its tasks.

A name is matched the way secret scanners match it: split into words (on ``_``, ``-``, ``.``,
a lower-to-upper case change and a letter/digit change), then a word list over the words --
not a substring search, so ``PATH`` is not ``PAT`` and ``KEYBOARD`` not ``KEY``.

A name is a secret when
* one of its words is in ``SECRET_WORDS`` (``KEY``, ``DB_PASS``, ``GITHUB_PAT``,
  ``AZURE_STORAGE_SAS``, ``apiKey``), or
* one of its words ends with one of ``SECRET_SUFFIXES`` (``DBPASSWORD``, ``MYTOKEN``), or
* two words next to each other are a phrase of ``SECRET_PHRASES``
  (``AZURE_STORAGE_CONNECTION_STRING``),
or it is one of ``SECRET_NAMES`` (``JOBQ_POSTGRES_URL``, ``PGPASSFILE``),
and it is not in ``NOT_SECRET`` (``PWD``: the shell's working directory) nor let through by
the operator (``--pass-env NAME,NAME``).

Called by worker/launch.py (the main thread, once at start); docs/security.rst lists the
words.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping

SECRET_WORDS = frozenset({
    "key", "keys", "apikey", "accesskey", "secretkey", "privatekey", "signingkey",
    "token", "tokens", "secret", "secrets",
    "pass", "passwd", "password", "passwords", "passphrase", "pwd", "pat",
    "sas", "credential", "credentials", "cred", "creds", "auth", "private", "signature",
    "connstr", "connectionstring",
})
# A word that ends with one of these is a secret too; only words no common word ends with
# (there is no such suffix rule for "key": monkey, turkey).
SECRET_SUFFIXES = ("password", "passwd", "passphrase", "secret", "secrets", "token", "tokens",
                   "apikey", "credential", "credentials")
SECRET_PHRASES = frozenset({("connection", "string"), ("conn", "str"), ("conn", "string")})
# Whole names that are secrets though no word says so: the PostgreSQL backend's URL (it may
# hold the password) and libpq's password file.
SECRET_NAMES = frozenset({"JOBQ_POSTGRES_URL", "PGPASSFILE", "PGPASSWORD"})
# Whole names that match a word but are no secret.
NOT_SECRET = frozenset({"PWD"})

# An upper-case run followed by an upper+lower word (the "API" of "APIKey"), a capitalised
# or lower-case word, or a run of digits.
_WORD = re.compile(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|[0-9]+")


def name_words(name: str) -> list[str]:
    """The lower-case words of a variable name (``"myAPIKey_2"``: my, api, key, 2)."""
    return [w.lower() for w in _WORD.findall(name)]


def is_secret_name(name: str) -> bool:
    """Does the name of an environment variable say it holds a secret?"""
    if name in SECRET_NAMES:
        return True
    if name in NOT_SECRET:
        return False
    words = name_words(name)
    if any(w in SECRET_WORDS or w.endswith(SECRET_SUFFIXES) for w in words):
        return True
    return any(pair in SECRET_PHRASES for pair in zip(words, words[1:]))


def without_secrets(env: Mapping[str, str], pass_env: Collection[str] = ()) -> dict[str, str]:
    """``env`` minus the secret names, except those in ``pass_env`` (exact names)."""
    return {k: v for k, v in env.items() if k in pass_env or not is_secret_name(k)}
