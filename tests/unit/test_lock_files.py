"""Issue 38: the lock files (conf/lock/) agree with setup.cfg, and the check that says so
fails on each way they can disagree (scripts/lock_files.py, which scripts/lock runs)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))

from lock_files import declared, digest, pins, problems  # noqa: E402

pytestmark = pytest.mark.timeout(60)


def test_the_lock_files_agree_with_setup_cfg() -> None:
    assert problems(REPO) == [], "run scripts/lock"


def test_every_extra_and_every_requirement_is_locked_and_hashed() -> None:
    want = declared(REPO)
    assert {"base", "test", "docs", "postgres", "dashboard", "metrics", "tools"} <= set(want)
    for name, requirements in want.items():
        pinned = pins((REPO / "conf" / "lock" / f"{name}.txt").read_text())
        assert pinned and all(hashed for *_, hashed in pinned), name
        names = {n for n, *_ in pinned}
        if name != "tools":  # the package builds from the lock alone
            assert {"setuptools", "wheel"} <= names
        for req in requirements:
            assert re.split(r"[<>=!~\[; ]", req)[0].lower().replace("_", "-") in names, req


@pytest.fixture
def copy(tmp_path: Path) -> Path:
    for name in ("setup.cfg", "pyproject.toml"):
        shutil.copy(REPO / name, tmp_path / name)
    shutil.copytree(REPO / "conf" / "lock", tmp_path / "conf" / "lock")
    assert problems(tmp_path) == []
    return tmp_path


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new, 1))


def test_a_raised_lower_bound_is_a_mismatch(copy: Path) -> None:
    _edit(copy / "setup.cfg", "psutil>=5.9", "psutil>=999")
    found = problems(copy)
    assert any("base.txt: psutil==" in p and "outside setup.cfg's >=999" in p for p in found)
    assert any("base.txt: made from other requirements" in p for p in found)


def test_a_new_requirement_and_a_new_extra_are_mismatches(copy: Path) -> None:
    _edit(copy / "setup.cfg", "    psutil>=5.9\n", "    psutil>=5.9\n    attrs>=20\n")
    _edit(copy / "setup.cfg", "[options.extras_require]\n",
          "[options.extras_require]\ngpu =\n    nvidia-ml-py>=12\n")
    found = "\n".join(problems(copy))
    assert "base.txt: made from other requirements" in found
    assert "gpu.txt: missing (setup.cfg has the extra gpu)" in found


def test_a_lock_file_edited_by_hand_is_a_mismatch(copy: Path) -> None:
    lock = copy / "conf" / "lock" / "docs.txt"
    lines = lock.read_text().splitlines(keepends=True)
    first = next(i for i, line in enumerate(lines) if "==" in line and line[0] not in " #")
    lines[first] = lines[first].replace(" \\\n", "\n")  # the first pin, without its hashes
    while lines[first + 1].lstrip().startswith("--hash="):
        del lines[first + 1]
    lock.write_text("".join(lines))
    assert any("docs.txt: pins without --hash" in p for p in problems(copy))
    (copy / "conf" / "lock" / "old.txt").write_text("")
    assert "conf/lock/old.txt: no such extra in setup.cfg" in problems(copy)


def test_the_digest_ignores_order_and_spacing() -> None:
    assert digest(["b>=1", "a >= 2"]) == digest(["a>=2", "b >=1"])
    assert digest(["a>=2"]) != digest(["a>=3"])


def test_scripts_lock_check_says_what_disagrees(copy: Path) -> None:
    """``scripts/lock --check`` (what a maintainer runs): exit 1 and a line per mismatch."""
    _edit(copy / "setup.cfg", "psutil>=5.9", "psutil>=999")
    shutil.copytree(REPO / "scripts", copy / "scripts")
    res = subprocess.run([sys.executable, str(copy / "scripts" / "lock_files.py"), "check"],
                         capture_output=True, text=True, timeout=30)
    assert res.returncode == 1
    assert "psutil==" in res.stderr and "run scripts/lock" in res.stderr
    ok = subprocess.run([sys.executable, str(REPO / "scripts" / "lock_files.py"), "check"],
                        capture_output=True, text=True, timeout=30)
    assert (ok.returncode, ok.stderr) == (0, "")
