"""core/ imports nothing else of the package; fleet/ only core/, backends/ and fleet/ (issue
27; docs/architecture.rst).  Every import counts: module level, in a function, under
TYPE_CHECKING.  No processes: the source is read with ``ast``."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "supervisor"
MAY_IMPORT = {"core": {"core"}, "fleet": {"core", "backends", "fleet"}}


def _imported_packages(path: Path) -> set[str]:
    """The top-level packages of ours (``core``, ``worker``...) that ``path`` imports."""
    here = path.relative_to(PACKAGE).parent.parts
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = list(here[:len(here) - node.level + 1])
                parts = base + (node.module.split(".") if node.module else [])
                names = [parts] if node.module or base else [[a.name] for a in node.names]
            elif node.module and node.module.startswith("supervisor."):
                names = [node.module.split(".")[1:]]
            else:
                continue
            found |= {p[0] for p in names if p}
        elif isinstance(node, ast.Import):
            found |= {a.name.split(".")[1] for a in node.names
                      if a.name.startswith("supervisor.") and "." in a.name}
    return found


def test_core_and_fleet_import_only_their_layers() -> None:
    bad = []
    for layer, allowed in MAY_IMPORT.items():
        for path in sorted((PACKAGE / layer).rglob("*.py")):
            for package in _imported_packages(path) - allowed:
                if (PACKAGE / package).is_dir():
                    bad.append(f"{path.relative_to(PACKAGE)} imports {package}/")
    assert not bad, "\n".join(bad)
