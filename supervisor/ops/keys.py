"""The key an operator signs with (control records, pushed tasks): the first
``--signing-key-file`` of the parsed options -- list the newest first; a worker accepts every
key it is given.  Main thread (jobq-ctl, the dashboard's start)."""

from __future__ import annotations

import argparse

from ..core.options import UsageError
from ..core.signing import SecurityConfigError, SigningKey, load_key, split_paths


def first_key(ns: argparse.Namespace) -> SigningKey | None:
    """The first --signing-key-file's key, or None; a key that cannot be read is a
    UsageError."""
    key_paths = split_paths(getattr(ns, "signing_key_file", None))
    try:
        return load_key(key_paths[0]) if key_paths else None
    except SecurityConfigError as exc:
        raise UsageError(str(exc)) from None
