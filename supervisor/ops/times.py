"""Times as an operator reads them: ISO-8601 UTC in every JSON output (``iso``), a short
age such as ``2h05m`` (``duration_text``).  Any thread."""

from __future__ import annotations

import time
from collections.abc import Mapping

# Epoch seconds in the backends' records; ISO-8601 UTC strings in every JSON output.
TIME_KEYS = frozenset({"locked_at", "locked_until", "failed_at"})


def iso(ts: float | None) -> str:
    if ts is None:
        return "-"
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))


def iso_or_none(ts: float | None) -> str | None:
    return None if ts is None else iso(ts)


def iso_times(row: Mapping[str, object]) -> dict[str, object]:
    """``row`` with its TIME_KEYS as ISO-8601 UTC (or None), as every JSON output has them."""
    return {k: _iso_value(v) if k in TIME_KEYS else v for k, v in row.items()}


def _iso_value(v: object) -> object:
    return iso_or_none(v) if v is None or isinstance(v, (int, float)) else v


def duration_text(seconds: float) -> str:
    s = int(max(0.0, seconds))
    for unit, size, sub, sub_size in (("d", 86400, "h", 3600), ("h", 3600, "m", 60),
                                      ("m", 60, "s", 1)):
        if s >= size:
            return f"{s // size}{unit}{(s % size) // sub_size:02d}{sub}"
    return f"{s}s"
