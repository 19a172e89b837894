"""The lock files (conf/lock/*.txt): what each is made from, and whether they still agree
with setup.cfg.  scripts/lock writes them (``write``) and checks them (``check``);
tests/unit/test_lock_files.py runs the check.

One file per install: ``base`` (install_requires) and one per extra (install_requires and
that extra).  All of them come from one resolution of everything at once, so any of them
can be installed together (``-r conf/lock/test.txt -r conf/lock/docs.txt``).  Each also pins
the build requirements of pyproject.toml, so that the package itself is installed with
``--no-deps --no-build-isolation`` and nothing comes from the index unhashed.  The files are
universal (uv's ``--universal``): one file serves every Python that setup.cfg allows, with
environment markers where a release differs.

Each file's first lines record a digest of the requirements it was made from; the check
compares that digest and each pinned version with setup.cfg and pyproject.toml as they are.
"""

from __future__ import annotations

import configparser
import hashlib
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
LOCK_DIR = Path("conf") / "lock"
# The installer and resolver of the project's scripts (scripts/venv installs the locks with
# it: ~2 s against pip's ~30 s; scripts/lock resolves with it): conf/lock/tools.txt.
UV = "uv==0.13.10"
DIGEST = "# requirements-sha256: "
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;]+)\s*(?:;\s*(.+?))?\s*$")


def declared(root: Path = ROOT) -> dict[str, list[str]]:
    """Lock file name -> the requirements it is made from, as setup.cfg and pyproject.toml
    say them: ``base`` and one per extra, each with the build requirements; and ``tools``,
    the scripts' own installer (UV)."""
    cfg = configparser.ConfigParser()
    cfg.read(root / "setup.cfg")
    base = _lines(cfg.get("options", "install_requires", fallback=""))
    build = build_requirements(root)
    out = {"base": base + build, "tools": [UV]}
    if cfg.has_section("options.extras_require"):
        for extra, text in cfg.items("options.extras_require"):
            out[extra] = base + _lines(text) + build
    return out


def build_requirements(root: Path = ROOT) -> list[str]:
    """``[build-system] requires`` of pyproject.toml (read without a TOML library: Python 3.9
    has none, and the list is one line of strings)."""
    text = (root / "pyproject.toml").read_text()
    match = re.search(r"^requires\s*=\s*\[([^\]]*)\]", text, re.M)
    return re.findall(r'"([^"]+)"', match.group(1)) if match else []


def python_floor(root: Path = ROOT) -> str:
    cfg = configparser.ConfigParser()
    cfg.read(root / "setup.cfg")
    return cfg.get("options", "python_requires").strip().lstrip(">=").strip()


def _lines(text: str) -> list[str]:
    return [line.split("#")[0].strip() for line in text.splitlines()
            if line.split("#")[0].strip()]


def digest(requirements: list[str]) -> str:
    """The same for the same set of requirements, whatever their order or spelling of
    names."""
    norm = sorted({str(Requirement(r)).replace(" ", "") for r in requirements})
    return hashlib.sha256("\n".join(norm).encode()).hexdigest()


def _logical(text: str) -> list[str]:
    """The requirement lines of a lock file, each joined with its ``\\`` continuations
    (``--hash=`` options), comments left out."""
    out: list[str] = []
    joined = ""
    for line in text.splitlines():
        if line.lstrip().startswith("#"):
            continue
        joined += " " + line.rstrip().rstrip("\\")
        if not line.rstrip().endswith("\\"):
            if joined.strip():
                out.append(joined.strip())
            joined = ""
    if joined.strip():
        out.append(joined.strip())
    return out


def pins(text: str) -> list[tuple[str, Version, str, bool]]:
    """(name, version, marker, hashed) of each ``name==version`` line of a lock file."""
    out: list[tuple[str, Version, str, bool]] = []
    for line in _logical(text):
        spec, _, options = line.partition(" --")
        match = _PIN.match(spec.strip())
        if match:
            out.append((canonicalize_name(match.group(1)), Version(match.group(2)),
                        (match.group(3) or "").strip(), "hash=" in options))
    return out


def problems(root: Path = ROOT) -> list[str]:
    """What disagrees between setup.cfg (and pyproject.toml) and conf/lock/: a missing or
    extra lock file, one made from other requirements, a requirement it lacks or pins outside
    its range, a pin without a hash.  Empty when they agree."""
    found: list[str] = []
    want = declared(root)
    lock_dir = root / LOCK_DIR
    have = {p.stem for p in lock_dir.glob("*.txt")} if lock_dir.is_dir() else set()
    for name in sorted(have - set(want)):
        found.append(f"{LOCK_DIR}/{name}.txt: no such extra in setup.cfg")
    for name, requirements in sorted(want.items()):
        path = lock_dir / f"{name}.txt"
        label = f"{LOCK_DIR}/{name}.txt"
        if not path.is_file():
            what = {"base": "setup.cfg has install_requires", "tools": f"the scripts use {UV}"
                    }.get(name, f"setup.cfg has the extra {name}")
            found.append(f"{label}: missing ({what})")
            continue
        text = path.read_text()
        if f"{DIGEST}{digest(requirements)}" not in text:
            found.append(f"{label}: made from other requirements than setup.cfg's now")
        pinned = pins(text)
        for req in map(Requirement, requirements):
            key = canonicalize_name(req.name)
            versions = [(v, m) for n, v, m, _ in pinned if n == key]
            if not versions:
                found.append(f"{label}: {req.name} is not pinned (setup.cfg: {req})")
            for version, marker in versions:
                if version not in req.specifier:
                    found.append(f"{label}: {req.name}=={version}"
                                 f"{' ; ' + marker if marker else ''} is outside "
                                 f"setup.cfg's {req.specifier}")
        unhashed = sorted({n for n, _, _, hashed in pinned if not hashed})
        if unhashed:
            found.append(f"{label}: pins without --hash: {', '.join(unhashed)}")
    return found


def write(root: Path, uv: str, upgrade: bool) -> None:
    """Resolve everything once (universal), then each lock file within that resolution (uv's
    ``-c``), hashed, each headed by the digest of what it was made from.  Unless ``upgrade``,
    the pins of the files there now are kept where the ranges still allow them (uv prefers
    what its output file holds), so a changed requirement moves only what it must."""
    want = declared(root)
    every = sorted({r for reqs in want.values() for r in reqs})
    floor = python_floor(root)
    (root / LOCK_DIR).mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        union = Path(tmp) / "all.txt"
        if not upgrade:
            union.write_text(_pinned_now(root))
        _compile(uv, every, union, floor, constraints=None, hashes=False)
        for name, requirements in sorted(want.items()):
            out = Path(tmp) / f"{name}.txt"
            _compile(uv, requirements, out, floor, constraints=union, hashes=True)
            body = out.read_text()
            if name == "tools":
                head = ("# conf/lock/tools.txt: written by scripts/lock from lock_files.UV, the "
                        "installer scripts/venv uses; do not edit.\n")
            else:
                what = "install_requires" if name == "base" else f"install_requires + {name}"
                head = (f"# conf/lock/{name}.txt: written by scripts/lock from setup.cfg "
                        f"({what}) and pyproject.toml's build requirements; do not edit.\n"
                        f"# Install: pip install --require-hashes -r conf/lock/{name}.txt, "
                        f"then pip install --no-deps --no-build-isolation .\n")
            head += f"{DIGEST}{digest(requirements)}\n"
            (root / LOCK_DIR / f"{name}.txt").write_text(head + body)
        stale = {p.stem for p in (root / LOCK_DIR).glob("*.txt")} - set(want)
        for name in stale:
            (root / LOCK_DIR / f"{name}.txt").unlink()


def _pinned_now(root: Path) -> str:
    """Every pin of the lock files there now, once each, with its marker."""
    lines = {f"{n}=={v}" + (f" ; {m}" if m else ""): None
             for path in sorted((root / LOCK_DIR).glob("*.txt"))
             for n, v, m, _ in pins(path.read_text())}
    return "".join(f"{line}\n" for line in lines)


def _compile(uv: str, requirements: list[str], out: Path, floor: str,
             constraints: Path | None, hashes: bool) -> None:
    """``uv pip compile`` of ``requirements`` into ``out``, run in out's directory so that
    the annotations name the inputs by their short names, which are then made setup.cfg's."""
    source = out.with_suffix(".in")
    source.write_text("\n".join(requirements) + "\n")
    cmd = [uv, "pip", "compile", source.name, "--universal", "--python-version", floor,
           "--no-header", "--quiet", "--annotation-style", "line", "--output-file", out.name]
    if hashes:
        cmd.append("--generate-hashes")
    if constraints is not None:
        cmd += ["--constraint", constraints.name]
    subprocess.run(cmd, check=True, cwd=out.parent)
    text = out.read_text().replace(f"-r {source.name}", "setup.cfg")
    if constraints is not None:  # every pin is within it: saying so on each line tells nothing
        text = re.sub(rf"(-c {re.escape(constraints.name)}, |, -c {re.escape(constraints.name)})",
                      "", text)
    out.write_text(text)


def main(argv: list[str]) -> int:
    if argv[:1] == ["check"]:
        found = problems(ROOT)
        for line in found:
            print(f"scripts/lock: {line}", file=sys.stderr)
        if found:
            print("scripts/lock: the lock files disagree with setup.cfg: run scripts/lock",
                  file=sys.stderr)
        return 1 if found else 0
    if argv[:1] == ["write"] and len(argv) in (2, 3) and argv[2:] in ([], ["--upgrade"]):
        write(ROOT, argv[1], upgrade=argv[2:] == ["--upgrade"])
        found = problems(ROOT)
        for line in found:
            print(f"scripts/lock: {line}", file=sys.stderr)
        return 1 if found else 0
    print("usage: lock_files.py check | write UV [--upgrade]", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
