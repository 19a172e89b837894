"""Reading a stored attempt's output from its end: where it ends (``output_end``, found by
one-byte probes rather than by downloading it) and its last lines (``tail``).  ``jobq-ctl
logs --tail`` and the dashboard's output view read with these.  The caller's thread."""

from __future__ import annotations

from ..fleet.output.base import AttemptKey, OutputStore

PROBE = 1 << 20  # tail: the end of an attempt is found to within this many bytes ...
TAIL_STEP = 256 << 10  # ... then read backwards in steps of this size ...
TAIL_MAX = 16 << 20  # ... for at most this much (the last lines of a huge one-line output)


def output_end(store: OutputStore, key: AttemptKey) -> int:
    """The size of the attempt's output, found by one-byte reads (about 2*log2(size/PROBE))
    rather than by downloading it."""
    lo, hi = 0, PROBE  # data ends at or after lo, before hi (once a probe at hi-1 failed)
    while store.read(key, hi - 1, 1).data:
        lo, hi = hi, hi * 2
    while hi - lo > PROBE:
        mid = (lo + hi) // 2
        if store.read(key, mid - 1, 1).data:
            lo = mid
        else:
            hi = mid
    while True:
        chunk = store.read(key, lo)
        if not chunk.data:
            return lo
        lo = chunk.offset


def _read_range(store: OutputStore, key: AttemptKey, start: int, end: int) -> bytes:
    parts = []
    while start < end:
        chunk = store.read(key, start, end - start)
        if not chunk.data:
            break
        parts.append(chunk.data)
        start = chunk.offset
    return b"".join(parts)


def tail(store: OutputStore, key: AttemptKey, n: int) -> tuple[bytes, int]:
    """The last ``n`` lines of the attempt's output (at most TAIL_MAX bytes of them) and the
    offset after them, reading backwards from the end."""
    end = output_end(store, key)
    start, buf = end, b""
    while start > 0 and len(buf) < TAIL_MAX:
        body = buf[:-1] if buf.endswith(b"\n") else buf
        if body.count(b"\n") >= n:  # the first of the last n lines starts after a newline
            break
        new_start = max(0, start - TAIL_STEP)
        buf = _read_range(store, key, new_start, start) + buf
        start = new_start
    lines = buf.splitlines(keepends=True)
    return (b"".join(lines[-n:]) if n > 0 else b""), end
