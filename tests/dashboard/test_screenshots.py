"""scripts/screenshots, the docs' dashboard screenshots taken in a real headless Chromium: it
shoots every page the dashboard serves (a new page fails here until it is shot or named as not
shown), and a whole run on a throw-away queue writes each PNG at its size and leaves no
process behind (~9 CPU-s: two workers, the dashboard and Chromium)."""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

import psutil
import pytest

from tests.dashboard.conftest import data_source, need_browser

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))
import screenshots  # noqa: E402


def test_every_page_of_the_dashboard_is_shot_or_named_as_not_shown(env):
    from supervisor.dashboard.app import create_app

    app = create_app(data_source(env))
    pages = {rule.rule for rule in app.url_map.iter_rules()
             if "GET" in (rule.methods or ()) and not rule.rule.startswith("/api/")}
    shot = {page.rule for page in screenshots.PAGES}
    assert pages == shot | set(screenshots.NOT_SHOWN), (
        f"not shot: {sorted(pages - shot - set(screenshots.NOT_SHOWN))}; "
        f"no such page: {sorted((shot | set(screenshots.NOT_SHOWN)) - pages)}")
    assert not shot & set(screenshots.NOT_SHOWN)
    names = [page.name for page in screenshots.PAGES]
    assert len(set(names)) == len(names)


def _png_size(path: Path) -> tuple[int, int]:
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n" and head[12:16] == b"IHDR", path
    width, height = struct.unpack(">II", head[16:24])
    return width, height


def _ours(tmp: Path) -> list[psutil.Process]:
    """Live processes that name ``tmp`` in their command line or work in it."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.status() == psutil.STATUS_ZOMBIE:
                continue
            if str(tmp) in " ".join(proc.cmdline()) or proc.cwd().startswith(str(tmp)):
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


@pytest.mark.timeout(300)
def test_a_run_writes_every_screenshot_and_leaves_nothing_running(tmp_path):
    need_browser()
    out = tmp_path / "shots"
    # The script's temporary folder goes in TMPDIR: a short one of the test's own, as
    # Chromium's socket path (under TMPDIR) must fit in 107 bytes, which tmp_path may not.
    short = Path(tempfile.mkdtemp(prefix="jobq-shots-"))
    try:
        res = subprocess.run([sys.executable, str(REPO / "scripts" / "screenshots.py"),
                              "--out", str(out)], capture_output=True, text=True, timeout=280,
                             env={**os.environ, "TMPDIR": str(short)}, cwd=tmp_path)
        left = sorted(p.name for p in short.iterdir())
        survivors = _ours(short)
    finally:
        shutil.rmtree(short, ignore_errors=True)
    assert res.returncode == 0, res.stderr
    assert res.stderr == "", "no warning: no page is wider than its viewport"
    assert {p.name for p in out.iterdir()} == {f"{page.name}.png" for page in
                                               screenshots.PAGES}
    for page in screenshots.PAGES:
        assert _png_size(out / f"{page.name}.png") == page.size, page
    assert left == [], "its temporary folder (and Chromium's) removed"
    assert not survivors
