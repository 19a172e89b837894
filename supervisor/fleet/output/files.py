"""The output store of a SQLite queue: files beside the queue's database.

Layout: ``<database>.output/<queue>/<task id>/<attempt>.log`` and, once the attempt has
ended, an empty ``<attempt>.done`` beside it (removed by ``reopen`` when the attempt runs
again after an uncounted release).  Path parts are percent-escaped (``part``), so
no task id can reach outside its directory.

Files, not rows in the queue's database: the database's one write lock belongs to the data
plane (receive, renew, settle of every supervisor on the host), and a task printing megabytes
a second would hold it for its flushes.  Appending to a file takes no lock anyone else waits
for, and an operator can ``tail -f`` it too.  Measured: docs/fleet-internals.rst, "Task output".

Writer: the worker's output-store thread; readers: jobq-ctl, the dashboard.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
from urllib.parse import unquote

from .base import READ_LIMIT, AttemptKey, Chunk, OutputStoreError, OutputStoreFull

_SAFE = re.compile(r"[A-Za-z0-9_-]")


def part(text: str) -> str:
    """``text`` as one path component: every character but letters, digits, ``_`` and ``-``
    (and a ``.`` that is not the first) becomes %XX of its UTF-8 bytes."""
    out = []
    for i, ch in enumerate(text):
        if _SAFE.match(ch) or (ch == "." and i > 0):
            out.append(ch)
        else:
            out.extend(f"%{b:02X}" for b in ch.encode("utf-8"))
    return "".join(out) or "%"


def output_dir(sqlite_path: str) -> str:
    return os.path.abspath(sqlite_path) + ".output"


class FileOutputStore:
    name = "files"

    def __init__(self, root: str) -> None:
        self.root = root

    def __repr__(self) -> str:
        return f"FileOutputStore({self.root!r})"

    def _base(self, key: AttemptKey) -> str:
        return os.path.join(self.root, part(key.queue), part(key.task_id), str(key.attempt))

    def append(self, key: AttemptKey, data: bytes) -> None:
        """All of ``data`` or none of it: a write cut short by a disk that filled up is
        undone (ftruncate needs no space), so a reader never sees half a chunk and the retry
        of the same bytes stores them once.  Unbuffered: a buffered file keeps the unwritten
        rest and flushes it again before truncating -- which fails the same way."""
        path = self._base(key) + ".log"
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
        except OSError as exc:
            raise self._error(exc) from None
        try:
            start = os.fstat(fd).st_size
            rest = memoryview(data)
            while rest:
                rest = rest[os.write(fd, rest):]
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, start)
            raise self._error(exc) from None
        finally:
            os.close(fd)

    def _error(self, exc: OSError) -> OutputStoreError:
        kind = OutputStoreFull if exc.errno in (errno.ENOSPC, errno.EDQUOT) else OutputStoreError
        return kind(f"output store {self.root}: {exc.strerror or exc}")

    def reopen(self, key: AttemptKey) -> int:
        """Output-store thread: a new attempt costs one failed stat (~5 us), a rerun a stat
        and an unlink of ``.done``."""
        base = self._base(key)
        try:
            size = os.stat(base + ".log").st_size
        except FileNotFoundError:
            return 0  # finish creates the .log with the .done: no .log, no .done
        except OSError as exc:
            raise OutputStoreError(f"output store {self.root}: {exc.strerror or exc}") from None
        try:
            os.unlink(base + ".done")
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise OutputStoreError(f"output store {self.root}: {exc.strerror or exc}") from None
        return size

    def finish(self, key: AttemptKey) -> None:
        base = self._base(key)
        try:
            os.makedirs(os.path.dirname(base), exist_ok=True)
            with open(base + ".log", "ab"):
                pass
            with open(base + ".done", "wb"):
                pass
        except OSError as exc:
            raise self._error(exc) from None

    def read(self, key: AttemptKey, offset: int = 0, limit: int = READ_LIMIT) -> Chunk:
        base = self._base(key)
        done = os.path.exists(base + ".done")  # before the read: then the read has it all
        try:
            with open(base + ".log", "rb") as fh:
                fh.seek(offset)
                data = fh.read(limit)
                size = os.fstat(fh.fileno()).st_size
        except FileNotFoundError:
            return Chunk(b"", offset, False)
        except OSError as exc:
            raise OutputStoreError(f"output store {self.root}: {exc.strerror or exc}") from None
        end = offset + len(data)
        return Chunk(data, end, done and end >= size)

    def attempts(self, queue: str, task_id: str) -> list[int]:
        folder = os.path.join(self.root, part(queue), part(task_id))
        try:
            names = os.listdir(folder)
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise OutputStoreError(f"output store {self.root}: {exc.strerror or exc}") from None
        return sorted(int(n[:-4]) for n in names if n.endswith(".log") and n[:-4].isdigit())

    def task_ids(self, queue: str, prefix: str, limit: int) -> list[str]:
        """A listing of the queue's folder (one folder per task)."""
        head = part(prefix)
        try:
            names = os.listdir(os.path.join(self.root, part(queue)))
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise OutputStoreError(f"output store {self.root}: {exc.strerror or exc}") from None
        return sorted(unquote(n) for n in names if n.startswith(head))[:limit]

    def purge(self, before: float) -> int:
        deleted = 0
        try:
            queues = os.listdir(self.root)
        except FileNotFoundError:
            return 0
        except OSError as exc:
            raise OutputStoreError(f"output store {self.root}: {exc.strerror or exc}") from None
        for q in queues:
            qdir = os.path.join(self.root, q)
            for task in _listdir(qdir):
                tdir = os.path.join(qdir, task)
                for name in _listdir(tdir):
                    if not name.endswith(".log"):
                        continue
                    path = os.path.join(tdir, name)
                    try:
                        if os.stat(path).st_mtime >= before:
                            continue
                        os.unlink(path)
                        deleted += 1
                    except OSError:
                        continue  # gone already (another worker purges too) or busy
                    try:
                        os.unlink(path[:-4] + ".done")
                    except OSError:
                        pass
                try:
                    os.rmdir(tdir)  # only when empty: a live attempt keeps it
                except OSError:
                    pass
        return deleted

    def close(self) -> None:
        pass


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []
