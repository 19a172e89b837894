"""A real small filesystem for full-disk and read-only tests: a tmpfs mounted in tmp_path.

Mounting needs root; without it the tests that use it skip with one line.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

SIZE = "4m"


class SmallDisk:
    """The mount at ``path``: ``fill`` it to the last byte, ``free`` it again, remount it
    ``read_only`` or ``writable``."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.filler = path / "filler"

    def fill(self) -> None:
        """Write until the filesystem says ENOSPC (tmpfs: not a page left)."""
        fd = os.open(self.filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        block = b"\0" * 65536
        try:
            while True:
                try:
                    os.write(fd, block)
                except OSError:
                    if len(block) == 1:
                        break
                    block = block[:len(block) // 2]
        finally:
            os.close(fd)
        st = os.statvfs(self.path)
        assert st.f_bavail == 0, "the disk is not full"

    def free(self) -> None:
        self.filler.unlink()

    def read_only(self) -> None:
        _mount("-o", "remount,ro", str(self.path))

    def writable(self) -> None:
        _mount("-o", "remount,rw", str(self.path))


def _mount(*args: str) -> None:
    subprocess.run(["mount", *args], check=True, capture_output=True, timeout=30)


@contextmanager
def small_disk(tmp_path: Path, name: str = "disk") -> Iterator[SmallDisk]:
    """A 4 MiB tmpfs at ``tmp_path/name``, unmounted at the end; a test module's fixture
    wraps it (requested before ``env``, so that the workers stop before the unmount)."""
    if os.geteuid() != 0:
        pytest.skip("needs root to mount a small tmpfs")
    path = tmp_path / name
    path.mkdir()
    _mount("-t", "tmpfs", "-o", f"size={SIZE},mode=0755", "jobq-test-disk", str(path))
    try:
        yield SmallDisk(path)
    finally:
        res = subprocess.run(["umount", str(path)], capture_output=True, timeout=30)
        if res.returncode != 0:  # something still holds a file there: detach it anyway
            subprocess.run(["umount", "-l", str(path)], capture_output=True, timeout=30)
