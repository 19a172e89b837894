"""The worker package's imports (issue 27): no import circle between its modules, counting
function-level and ``TYPE_CHECKING`` imports, and the main loop's events are plain data --
the modules that put them on the queue import events.py, never the other way round."""

from __future__ import annotations

import ast
from pathlib import Path

import supervisor.worker

WORKER = Path(supervisor.worker.__file__).parent


def _imports(path: Path) -> set[str]:
    """The worker modules ``path`` imports, anywhere in it (relative imports only: the
    package imports its own modules that way)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            if node.module:
                found.add(node.module.split(".")[0])
            else:
                found.update(alias.name for alias in node.names)
    return found


def _graph() -> dict[str, set[str]]:
    modules = {p.stem: p for p in WORKER.glob("*.py") if p.stem != "__init__"}
    return {name: _imports(path) & modules.keys() - {name} for name, path in modules.items()}


def _circle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle of ``graph``, or None."""
    done: set[str] = set()

    def visit(node: str, path: list[str]) -> list[str] | None:
        if node in path:
            return path[path.index(node):] + [node]
        if node in done:
            return None
        for nxt in sorted(graph[node]):
            found = visit(nxt, path + [node])
            if found:
                return found
        done.add(node)
        return None

    for start in sorted(graph):
        found = visit(start, [])
        if found:
            return found
    return None


def test_no_import_circle_in_the_worker() -> None:
    assert _circle(_graph()) is None


def test_events_import_no_producer_of_events() -> None:
    producers = {"launch", "preemption", "lifecycle", "loop", "main"}
    assert not _imports(WORKER / "events.py") & producers


def test_the_circle_finder_finds_one() -> None:
    assert _circle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]


def test_type_names_cost_no_import() -> None:
    """The names ``RunningTask``, the launcher and settlement are typed with (a control
    store's ``Cancel``, prometheus-client's metrics, the ``--metrics-port`` server's wsgiref)
    are imported for the type checker only: a worker with ``--control off`` and no metrics
    file or port loads none of them."""
    import subprocess
    import sys

    code = ("import sys, supervisor.worker.main, supervisor.worker.loop; "
            "print(sorted(m for m in sys.modules "
            "if m.startswith(('supervisor.fleet.control', 'prometheus_client', 'wsgiref'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=60).stdout
    assert out.strip() == "[]"
