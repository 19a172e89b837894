"""docs/getting-started.rst's first step runs as written (issue 41, 7): its example once ran
``python3 train.py``, which did not exist (152 s of retries, exit 4).

The page's literal blocks of "1. One machine, SQLite" run in a fresh directory, with the
installed commands on PATH: the first as one shell script (it writes train.py, pushes, runs
the worker), the second line by line with ``ID`` the failed task's id, each exit 0.  Steps 2
and 3 need root and a service, or a database server or an Azure account: not run here.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from tests.conftest import BIN

pytestmark = pytest.mark.timeout(120)

PAGE = Path(__file__).resolve().parents[2] / "docs" / "getting-started.rst"


def blocks(section: str) -> list[str]:
    """The literal blocks (after ``::``) of one section of the page, dedented."""
    text = PAGE.read_text()
    start = text.index(f"\n{section}\n")
    end = text.find("\n---", start + len(section) + 10)
    body = text[start:text.rfind("\n", 0, end) if end > 0 else len(text)]
    out = []
    for m in re.finditer(r"::\n\n((?:    .*\n|\n)+)", body):
        out.append("".join(line[4:] + "\n" for line in m.group(1).rstrip("\n").split("\n")))
    return out


def run(script: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("JOBQ_")}
    env["PATH"] = f"{BIN}:{env['PATH']}"
    return subprocess.run(["bash", "-c", script], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=90)


def test_the_first_step_runs_as_written(tmp_path) -> None:
    first, then = blocks("1. One machine, SQLite")
    res = run(first, tmp_path)
    assert res.returncode == 4, res  # as the page says: a task failed
    ids = re.findall(r"^[0-9a-f]{32}$", res.stdout, re.MULTILINE)
    assert len(ids) == 2, res.stdout
    failed = ids[1]  # seed 2
    for line in then.splitlines():
        command = line.split("#")[0].strip().replace(" ID", f" {failed[:8]}")
        res = run(command, tmp_path)
        assert res.returncode == 0, (command, res)
        if command.startswith("jobq-ctl logs"):
            assert "training with seed 2" in res.stdout, res.stdout
        if command == "jobq-ctl failed":
            assert failed[:8] in res.stdout and "exit status 3" in res.stdout, res.stdout
