"""The output store of an Azure control store: append blobs in the same storage account.

Layout: container ``--task-log-container`` (default ``jobq-logs``), one append blob per
attempt named ``<queue>/<task id>/<attempt>.log`` (fleet/output/blob_names.py).  An append blob
takes
at most 50,000 blocks (and a block, here, at most 4 MiB): an attempt that fills one rolls
over to ``<attempt>.log.1``, ``.log.2``... -- one logical byte stream, read by offset across
its parts.  ``finish`` sets metadata ``complete=1`` on the last part; ``reopen`` (a run of an
attempt released without counting) clears it.

Appends are retry-safe: each block is sent with the append-position condition (the size the
part must have), so a retry of a block that did land gets 412 AppendPositionConditionNotMet
with the part exactly one block longer -- taken as success, never stored twice.  A call that
raised remembers where its bytes began; the caller's retry of the same bytes resumes after
the blocks known to have landed.

Cost: an attempt's ``reopen`` one call (the create its first append needs anyway), then one
call per flush (per 4 MiB), ``finish`` one; the ``reopen`` of a rerun four (create, list,
properties, clear the flag);
``read`` one list call plus one ranged download; ``attempts`` one list call.

Retention (``purge``): lists the container one page per call (resuming where the last call
stopped) and deletes attempts whose newest part is older than the cut-off, at most
``purge_max`` deletes per call, so a worker's purge never stalls its output thread.  Each
worker sweeps the whole container by itself: at scale a lifecycle-management rule of the
storage account is cheaper (no listing, no calls from workers), e.g. with
``--task-output-retention 7d``::

    {"rules": [{"enabled": true, "name": "jobq-logs-retention", "type": "Lifecycle",
      "definition": {"filters": {"blobTypes": ["appendBlob"], "prefixMatch": ["jobq-logs/"]},
        "actions": {"baseBlob": {"delete": {"daysAfterModificationGreaterThan": 7}}}}}]}

Threads: one instance per thread (the worker's output-store thread, or a jobq-ctl command).
No SDK retries and explicit connect/read timeouts: every call fails within seconds with
OutputStoreError (one line, no secret).  ``create=False`` (jobq-ctl) never creates anything;
a missing container reads as no output.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable, TypeVar, Union
from urllib.parse import unquote

from azure.core import MatchConditions
from azure.core.exceptions import (
    AzureError,
    HttpResponseError,
    ResourceExistsError,
    ResourceNotFoundError,
)
from azure.storage.blob import BlobProperties, ContainerClient

from ...backends.azure_common import short
from ...core.azure_account import create_if_missing, error_code, sdk_client, store_error
from .base import READ_LIMIT, AttemptKey, Chunk, OutputConfigError, OutputStoreError
from .blob_names import ATTEMPT, PART, attempt_base, blob_base, part_name, scrubber, segment
from .files import part

log = logging.getLogger("jobq.output")
T = TypeVar("T")
MAX_BLOCK = 4 << 20  # bytes per append_block call
MAX_BLOCKS = 50_000  # committed blocks an append blob takes
_ERRORS = (AzureError, OSError, ValueError)  # what SDK calls raise
_CACHED = 256  # attempts whose append position is remembered


@dataclass
class _Tail:
    """Where an attempt's output ends: its last part, as far as this writer knows."""

    part: int = -1  # -1: no blob yet
    base: int = 0  # logical offset of the part's first byte
    size: int = 0
    blocks: int = 0
    stale: bool = False  # read it afresh before the next append
    complete: bool = False  # the last part says complete=1 (as last read)
    pending: Union[tuple[int, bytes], None] = None  # (logical start, bytes) of a call that raised

    @property
    def end(self) -> int:
        return self.base + self.size


class BlobOutputStore:
    """Exactly one of ``connection_string`` (naming the blob endpoint or a real account) or
    ``account_url`` (the blob endpoint; a SAS in the URL, ``credential`` or
    DefaultAzureCredential).  ``max_block``/``max_blocks``: the append-blob limits (tests make
    them tiny to roll over).  ``client_options`` go to the SDK client (tests add hooks)."""

    name = "azure-blob"

    def __init__(self, *, connection_string: Union[str, None] = None,
                 account_url: Union[str, None] = None, credential: Any = None,
                 container: str = "jobq-logs", create: bool = True,
                 connect_timeout: float = 3.0, read_timeout: float = 10.0,
                 max_block: int = MAX_BLOCK, max_blocks: int = MAX_BLOCKS,
                 purge_max: int = 100, page_size: int = 5000,
                 client_options: Union[dict[str, Any], None] = None) -> None:
        if bool(connection_string) == bool(account_url):
            raise OutputConfigError(
                "output store: needs exactly one of a connection string or an account URL")
        self.scrub = scrubber(connection_string, account_url)
        self.create = create
        self.max_block, self.max_blocks = max_block, max_blocks
        self.purge_max, self.page_size = purge_max, page_size
        self._tails: dict[AttemptKey, _Tail] = {}
        self._purge_token: Union[str, None] = None
        try:
            self._container: ContainerClient = sdk_client(
                ContainerClient, connection_string=connection_string, account_url=account_url,
                credential=credential, connect_timeout=connect_timeout,
                read_timeout=read_timeout, container_name=container, **(client_options or {}))
        except (ValueError, TypeError) as exc:
            raise OutputConfigError(f"output store: bad connection string or account URL: "
                                    f"{short(self.scrub(str(exc)))}") from None
        self.endpoint = self.scrub(self._container.url.split("?", 1)[0])

    def __repr__(self) -> str:
        return f"BlobOutputStore({self.endpoint!r})"

    # ------------------------------------------------------------------------- plumbing
    def _error(self, what: str, exc: BaseException) -> OutputStoreError:
        first = (str(exc).splitlines() or [""])[0]
        return store_error(exc, f"output store {what}",
                           short(self.scrub(f"{type(exc).__name__}: {first}")),
                           OutputConfigError, OutputStoreError)

    def _call(self, what: str, fn: Callable[[], T]) -> T:
        try:
            return fn()
        except _ERRORS as exc:
            raise self._error(what, exc) from None

    def _listing(self, prefix: str, metadata: bool = False) -> list[BlobProperties]:
        """The blobs under ``prefix``; none when the container does not exist."""
        include = ["metadata"] if metadata else None
        try:
            return list(self._container.list_blobs(name_starts_with=prefix, include=include))
        except ResourceNotFoundError:
            return []
        except _ERRORS as exc:
            raise self._error("list", exc) from None

    def _parts(self, key: AttemptKey) -> list[tuple[int, BlobProperties]]:
        """The attempt's parts, in order (one list call)."""
        base = blob_base(key)
        found = [(int(m.group(1) or 0), blob) for blob in self._listing(base, metadata=True)
                 if (m := PART.fullmatch(blob.name[len(base):]))]
        return sorted(found, key=lambda p: p[0])

    def _create_container(self) -> None:
        create_if_missing(self._container.create_container, store="output store",
                          kind="container", name=self._container.container_name,
                          errors=_ERRORS, fail=self._error, log=log)

    # -------------------------------------------------------------------- writer state
    def _tail(self, key: AttemptKey) -> _Tail:
        tail = self._tails.get(key)
        if tail is None:
            if len(self._tails) >= _CACHED:
                self._tails.pop(next(iter(self._tails)))
            # Assumed new (an attempt's output has one writer): the first create says if not.
            tail = self._tails[key] = _Tail()
        if tail.stale:
            self._load(key, tail)
        return tail

    def _load(self, key: AttemptKey, tail: _Tail) -> None:
        """Read where the attempt's output ends from the service (list + properties)."""
        parts = self._parts(key)
        tail.part, tail.base, tail.size, tail.blocks = -1, 0, 0, 0
        tail.complete = False
        if parts:
            tail.part = parts[-1][0]
            tail.complete = (parts[-1][1].metadata or {}).get("complete") == "1"
            props = self._call("read blob", self._container.get_blob_client(
                part_name(blob_base(key), tail.part)).get_blob_properties)
            tail.base, tail.size = sum(p.size for _, p in parts[:-1]), props.size
            tail.blocks = props.append_blob_committed_block_count or 0
        tail.stale = False

    def _new_part(self, key: AttemptKey, tail: _Tail, index: int,
                  metadata: Union[dict[str, str], None] = None) -> bool:
        """Create part ``index`` and make it the tail; True if created.  When it exists
        already (a retried create, or output this writer did not know of), the tail is read
        from the service instead."""
        blob = self._container.get_blob_client(part_name(blob_base(key), index))
        for _ in range(2):
            try:
                blob.create_append_blob(metadata=metadata,
                                        match_condition=MatchConditions.IfMissing)
            except ResourceExistsError:
                self._load(key, tail)
                return False
            except ResourceNotFoundError as exc:
                if not self.create or error_code(exc) != "ContainerNotFound":
                    raise self._error("create blob", exc) from None
                self._create_container()
                continue
            except _ERRORS as exc:
                raise self._error("create blob", exc) from None
            tail.base, tail.part, tail.size, tail.blocks = tail.end, index, 0, 0
            return True
        raise OutputStoreError(f"output store create blob: container "
                               f"{self._container.container_name} does not exist")

    def _put(self, key: AttemptKey, tail: _Tail, piece: bytes) -> None:
        """Append one block (at most max_block bytes) at the tail, rolling over first when
        the tail part is full."""
        for _ in range(3):  # a part another call filled, or purged under us: at most twice
            if 0 <= tail.part and tail.blocks < self.max_blocks:
                break
            self._new_part(key, tail, tail.part + 1)
        else:
            raise OutputStoreError("output store append: no part to append to")
        name = part_name(blob_base(key), tail.part)
        blob = self._container.get_blob_client(name)
        try:
            reply = blob.append_block(piece, length=len(piece), appendpos_condition=tail.size)
            blocks = reply.get("blob_committed_block_count")
        except HttpResponseError as exc:
            code = error_code(exc)
            if code == "BlockCountExceedsLimit":  # our count was off: roll over now
                tail.blocks = self.max_blocks
                self._put(key, tail, piece)
                return
            if code != "AppendPositionConditionNotMet":
                tail.stale = code in ("BlobNotFound", "ContainerNotFound")
                raise self._error(f"append {name}", exc) from None
            # The part is not where we left it: did this very block land before (a retry)?
            props = self._call("read blob", blob.get_blob_properties)
            if props.size != tail.size + len(piece):
                tail.stale = True
                raise OutputStoreError(f"output store append {name}: the blob holds "
                                       f"{props.size} bytes, not {tail.size}") from None
            blocks = props.append_blob_committed_block_count
        except _ERRORS as exc:
            raise self._error(f"append {name}", exc) from None
        tail.size += len(piece)
        tail.blocks = blocks if isinstance(blocks, int) else tail.blocks + 1

    # -------------------------------------------------------------------------- writes
    def append(self, key: AttemptKey, data: bytes) -> None:
        """Output-store thread.  A retry of bytes that raised resumes after what landed."""
        if not data:
            return
        tail = self._tail(key)
        start = tail.end
        if tail.pending is not None:
            if tail.pending[1] == data:
                start = tail.pending[0]
            else:  # given up on: some of those bytes may have landed
                self._load(key, tail)
                start = tail.end
        tail.pending = (start, data)
        done = min(max(tail.end - start, 0), len(data))
        while done < len(data):
            piece = data[done:done + self.max_block]
            self._put(key, tail, piece)
            done += len(piece)
        tail.pending = None

    def reopen(self, key: AttemptKey) -> int:
        """Output-store thread, before a run's first append: create the first part (what the
        first append would do); when it exists, read where the output ends and clear
        ``complete`` on the last part."""
        self._tails.pop(key, None)  # a tail this writer knew is from an earlier run
        tail = self._tail(key)
        if self._new_part(key, tail, 0):
            return 0
        if tail.complete:
            blob = self._container.get_blob_client(part_name(blob_base(key), tail.part))
            self._call("reopen", lambda: blob.set_blob_metadata({}))
            tail.complete = False
        return tail.end

    def finish(self, key: AttemptKey) -> None:
        """Output-store thread: metadata ``complete=1`` on the last part."""
        tail = self._tail(key)
        done = {"complete": "1"}
        if tail.part >= 0 or not self._new_part(key, tail, 0, metadata=done):
            blob = self._container.get_blob_client(part_name(blob_base(key), tail.part))
            self._call("finish", lambda: blob.set_blob_metadata(done))
        self._tails.pop(key, None)

    # --------------------------------------------------------------------------- reads
    def read(self, key: AttemptKey, offset: int = 0, limit: int = READ_LIMIT) -> Chunk:
        parts = self._parts(key)
        if not parts:
            return Chunk(b"", offset, False)
        total = sum(p.size for _, p in parts)
        complete = (parts[-1][1].metadata or {}).get("complete") == "1"
        got: list[bytes] = []
        at, lo = offset, 0
        for index, props in parts:
            hi = lo + props.size
            want = limit - (at - offset)
            if lo <= at < hi and want > 0:
                blob = self._container.get_blob_client(part_name(blob_base(key), index))
                n = min(hi - at, want)
                try:
                    data = blob.download_blob(offset=at - lo, length=n).readall()
                except ResourceNotFoundError:  # purged meanwhile
                    break
                except _ERRORS as exc:
                    raise self._error("read", exc) from None
                got.append(data)  # shorter than listed: the next part does not follow
                at += len(data)
            lo = hi
        return Chunk(b"".join(got), at, complete and at >= total)

    def attempts(self, queue: str, task_id: str) -> list[int]:
        prefix = f"{segment(queue)}/{segment(task_id)}/"
        names = (b.name[len(prefix):] for b in self._listing(prefix))
        return sorted({int(m.group(1)) for m in map(ATTEMPT.fullmatch, names) if m})

    def task_ids(self, queue: str, prefix: str, limit: int) -> list[str]:
        """One listing of the task folders under the prefix (``/``-delimited)."""
        head = f"{segment(queue)}/"
        try:
            found = [str(b.name)[len(head):].rstrip("/") for b in self._container.walk_blobs(
                name_starts_with=head + part(prefix), delimiter="/")]
        except ResourceNotFoundError:
            return []
        except _ERRORS as exc:
            raise self._error("list", exc) from None
        return sorted(unquote(n) for n in found)[:limit]

    # -------------------------------------------------------------------- housekeeping
    def purge(self, before: float) -> int:
        """Output-store thread: one page of the container (resuming the last call's
        listing), deleting attempts whose newest part is older than ``before``."""
        try:
            pages: Any = self._container.list_blobs(results_per_page=self.page_size).by_page(
                continuation_token=self._purge_token)
            page = list(next(pages, []))
            token = pages.continuation_token
        except ResourceNotFoundError:
            return 0
        except _ERRORS as exc:
            raise self._error("purge", exc) from None
        groups: dict[str, list[BlobProperties]] = {}
        for blob in page:
            base = attempt_base(blob.name)
            if base is not None:
                groups.setdefault(base, []).append(blob)
        if token and page:
            last = attempt_base(page[-1].name)
            if last is not None:  # its later parts may be on the next page: list them all
                groups[last] = self._listing(last)
        deleted = deletes = 0
        for blobs in groups.values():
            if deletes >= self.purge_max:
                token = self._purge_token  # come back to this page
                break
            if max(b.last_modified.timestamp() for b in blobs) >= before:
                continue
            for blob in blobs:
                try:
                    self._container.delete_blob(blob.name)
                except ResourceNotFoundError:
                    pass  # another worker purges too
                except _ERRORS as exc:
                    raise self._error("purge", exc) from None
                deletes += 1
            deleted += 1
        self._purge_token = token
        return deleted

    def close(self) -> None:
        self._container.close()
