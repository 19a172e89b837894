"""Issue 40 §2, builds that tell apart (supervisor/core/build.py, setup.py): ``--version`` of
both commands and a worker's record (``jobq-ctl workers``) carry the commit of the build,
``0.1.0+g<12 hex>``: in the editable test venv the checkout's; in a non-editable install (as
scripts/install-service makes) the commit it was built from, baked into the build, and the
plain release when built from a tree outside git.  The commit is read from ``.git``'s files
(a worktree's ``.git`` file, packed refs, a detached HEAD) without running git."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from supervisor import __version__
from supervisor.core import build
from tests.conftest import command, wait_for

pytestmark = pytest.mark.timeout(120)
REPO = Path(__file__).resolve().parents[2]
# what a build needs of the checkout (setup.cfg's metadata reads README.rst)
SOURCE = ("setup.py", "setup.cfg", "pyproject.toml", "README.rst", "supervisor")
GIT = shutil.which("git")
needs_git = pytest.mark.skipif(GIT is None, reason="git is not installed")


def git(cwd: Path, *args: str) -> str:
    assert GIT is not None
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.org",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.org",
           "GIT_CONFIG_NOSYSTEM": "1", "HOME": str(cwd)}
    return subprocess.run([GIT, "-C", str(cwd), *args], check=True, capture_output=True,
                          text=True, env=env, timeout=60).stdout.strip()


def versions_of(bin_dir: Path | None = None) -> set[str]:
    """What ``--version`` of both commands prints, without the command's name."""
    shown = set()
    for name in ("jobq-supervisor", "jobq-ctl"):
        cmd = [str(bin_dir / name)] if bin_dir else command(name)
        res = subprocess.run([*cmd, "--version"], capture_output=True, text=True, timeout=60)
        assert res.returncode == 0 and res.stderr == "", res
        prog, _, shown_version = res.stdout.rstrip("\n").partition(" ")
        assert prog == name and "\n" not in shown_version, res.stdout
        shown.add(shown_version)
    return shown


def checkout_head() -> str:
    if GIT is None or not (REPO / ".git").exists():
        pytest.skip("the tests do not run from a git checkout")
    return git(REPO, "rev-parse", "HEAD")


def test_version_names_the_checkouts_commit() -> None:
    head = checkout_head()
    assert build.read_commit(str(REPO)) == head
    assert versions_of() == {f"{__version__}+g{head[:12]}"}


def test_jobq_ctl_workers_shows_the_build(env) -> None:
    head = checkout_head()
    shown = f"{__version__}+g{head[:12]}"
    sup = env.supervisor("-n", "1", "--heartbeat-interval", "1", "--control-interval", "1")

    def records() -> list | None:  # None until the worker made the file and its record
        res = env.ctl("workers", "--json", check=False)
        return json.loads(res.stdout) if res.returncode == 0 else None

    try:
        [record] = wait_for(records, 60, what="the worker's record")
        assert record["version"] == shown
        header, row = env.ctl("workers").stdout.splitlines()[:2]
        column = header.index("VERSION")
        assert row[column:].startswith(shown + " ")
        assert row[header.index("STATE"):].startswith("running")
    finally:
        sup.stop()


def install(tree: Path, venv: Path) -> Path:
    """A non-editable install of ``tree`` into a new venv, as scripts/install-service does
    (``--no-deps --no-build-isolation``; offline): its bin directory.  The venv finds the
    dependencies (and setuptools, for the build) in the test venv's site-packages through a
    ``.pth`` file; that directory's own ``.pth`` files, the editable install's among them, are
    not read, so ``supervisor`` is the installed copy."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True,
                   timeout=60)
    py = venv / "bin" / "python"
    purelib = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()"
                              "['purelib'])"], check=True, capture_output=True, text=True,
                             timeout=60).stdout.strip()
    Path(purelib, "test-deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    uv = Path(sys.executable).parent / "uv"
    if not uv.exists():
        pytest.skip("uv is not in the test venv (scripts/venv installs it)")
    res = subprocess.run([str(uv), "pip", "install", "--quiet", "--offline", "--python",
                          str(py), "--no-deps", "--no-build-isolation", str(tree)],
                         capture_output=True, text=True, timeout=90)
    assert res.returncode == 0, res.stderr
    installed = Path(purelib, "supervisor")
    assert installed.is_dir() and not (installed / "core" / "build.py").is_symlink()
    return venv / "bin"


def copy_source(to: Path) -> Path:
    to.mkdir()
    for name in SOURCE:
        src = REPO / name
        if src.is_dir():
            shutil.copytree(src, to / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(src, to / name)
    return to


@needs_git
def test_a_non_editable_install_names_the_commit_it_was_built_from(tmp_path) -> None:
    tree = copy_source(tmp_path / "src")
    git(tree, "init", "-q")
    git(tree, "add", "-A")
    git(tree, "commit", "-q", "-m", "built")
    built = git(tree, "rev-parse", "HEAD")
    bin_dir = install(tree, tmp_path / "venv")
    assert versions_of(bin_dir) == {f"{__version__}+g{built[:12]}"}
    # baked in: a later commit of the tree changes nothing, and the tree got no file
    assert git(tree, "status", "--porcelain", "--untracked-files=all", "supervisor") == ""
    git(tree, "commit", "-q", "--allow-empty", "-m", "later")
    assert versions_of(bin_dir) == {f"{__version__}+g{built[:12]}"}


def test_a_build_from_a_tree_outside_git_shows_the_release(tmp_path) -> None:
    tree = copy_source(tmp_path / "src")
    assert versions_of(install(tree, tmp_path / "venv")) == {__version__}


@needs_git
def test_commit_read_from_a_worktree_packed_refs_and_a_detached_head(tmp_path,
                                                                     monkeypatch) -> None:
    def no_git(root: str) -> None:
        raise AssertionError("read_commit ran git")

    monkeypatch.setattr(build, "_from_git", no_git)
    main = tmp_path / "main"
    main.mkdir()
    git(main, "init", "-q", "-b", "trunk")
    assert build.read_commit(str(main)) is None  # no commit yet: unknown, no git run
    git(main, "commit", "-q", "--allow-empty", "-m", "one")
    first = git(main, "rev-parse", "HEAD")
    assert build.read_commit(str(main)) == first  # a loose ref
    git(main, "pack-refs", "--all")
    assert not (main / ".git" / "refs" / "heads" / "trunk").exists()
    assert build.read_commit(str(main)) == first  # packed-refs
    git(main, "worktree", "add", "-q", "-b", "side", str(tmp_path / "wt"))
    git(tmp_path / "wt", "commit", "-q", "--allow-empty", "-m", "two")
    second = git(tmp_path / "wt", "rev-parse", "HEAD")
    assert (tmp_path / "wt" / ".git").is_file()
    assert build.read_commit(str(tmp_path / "wt")) == second  # the worktree's own branch
    assert build.read_commit(str(main)) == first
    git(main, "checkout", "-q", "--detach", second)
    assert build.read_commit(str(main)) == second  # a detached HEAD
    assert build.read_commit(str(tmp_path)) is None  # no checkout at all
