"""Byte sizes as options give them (``512M``, ``2G``, ``100MiB``) and as messages show them:
``--task-memory-limit`` is parsed here (options.py) and worded here (worker/limits.py).
Pure functions, any thread."""

from __future__ import annotations

import re

_SIZE = re.compile(r"^\s*(\d+(?:\.\d*)?)\s*([kmgt]?)(i?b)?\s*$", re.IGNORECASE)
_SIZE_UNITS = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4}


def parse_size(text: str) -> int:
    """``512M``, ``2G``, ``100MiB``, ``1048576`` -> bytes (binary units).  Raises ValueError."""
    match = _SIZE.match(str(text))
    if not match:
        raise ValueError(f"invalid size {text!r} (use e.g. 512M, 2G)")
    value = int(float(match.group(1)) * _SIZE_UNITS[match.group(2).lower()])
    if value <= 0:
        raise ValueError(f"size must be positive: {text!r}")
    return value


def format_size(n: int) -> str:
    for unit, factor in (("T", 1024**4), ("G", 1024**3), ("M", 1024**2), ("K", 1024)):
        if n % factor == 0:
            return f"{n // factor}{unit}"
    return str(n)
