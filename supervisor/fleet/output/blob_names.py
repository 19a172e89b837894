"""Blob names of the Azure output store (fleet/output/azure_blob.py), and the scrubbing of its
secrets.

``<queue>/<task id>/<attempt>.log`` is an attempt's first part, ``.log.1``, ``.log.2``... its
later ones; path parts are percent-escaped (``segment``), so no id holds a ``/`` or reaches
into another's prefix.  Pure functions, any thread.
"""

from __future__ import annotations

import functools
import re
from typing import Callable, Union
from urllib.parse import parse_qs, quote

from ...backends.azure_common import Scrubber
from .base import AttemptKey
from .files import part

ATTEMPT = re.compile(r"(\d+)\.log(?:\.(\d+))?")
PART = re.compile(r"(?:\.(\d+))?")  # after ``<attempt>.log``


def segment(text: str) -> str:
    """``text`` as one blob-name segment: files.part, plus a trailing ``.`` escaped (Azure
    advises against names with dot-ended segments)."""
    s = part(text)
    return s[:-1] + "%2E" if s.endswith(".") else s


def blob_base(key: AttemptKey) -> str:
    return f"{segment(key.queue)}/{segment(key.task_id)}/{key.attempt}.log"


def part_name(base: str, index: int) -> str:
    return base if index == 0 else f"{base}.{index}"


def attempt_base(name: str) -> Union[str, None]:
    """``q/t/3.log.2`` -> ``q/t/3.log``; None for a blob that is not ours."""
    head, _, leaf = name.rpartition("/")
    m = ATTEMPT.fullmatch(leaf)
    return f"{head}/{m.group(1)}.log" if head and m else None


def scrubber(connection_string: Union[str, None],
             account_url: Union[str, None]) -> Callable[[str], str]:
    """Scrubber, plus a SAS signature as given and as the SDK re-encodes it."""
    scrub = Scrubber(connection_string, account_url)
    query = (account_url or "").partition("?")[2]
    sigs = re.findall(r"(?:^|&)sig=([^&]+)", query)
    sigs += [quote(v, safe="") for v in parse_qs(query).get("sig", [])]
    sigs = sorted((s for s in sigs if len(s) >= 8), key=len, reverse=True)
    return lambda text: functools.reduce(lambda t, sig: t.replace(sig, "***"), sigs, scrub(text))
