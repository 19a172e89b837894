"""core/kernel_files.py: the one reader of the kernel's small text files (the SQLite owner's
boot id, the DMI strings of an Azure VM)."""

from __future__ import annotations

from pathlib import Path

from supervisor.core.kernel_files import read_kernel_file


def test_the_text_stripped_and_the_default_when_unreadable(tmp_path: Path) -> None:
    path = tmp_path / "sys_vendor"
    path.write_bytes(b"Microsoft Corporation\n")
    assert read_kernel_file(str(path), "") == "Microsoft Corporation"
    assert read_kernel_file(str(tmp_path / "missing"), "?") == "?"
    assert read_kernel_file(str(tmp_path), "?") == "?"  # a directory: OSError too


def test_an_undecodable_byte_is_replaced_never_an_error(tmp_path: Path) -> None:
    path = tmp_path / "boot_id"
    path.write_bytes(b" 6f\xe9a \n")
    assert read_kernel_file(str(path), "?", "ascii") == "6f\ufffda"
    assert read_kernel_file(str(path), "?") == "6f\ufffda"  # not UTF-8 either
