"""The package's layers and its one thread helper, read from the source (docs/architecture.rst,
"Modules"): every import between two of our modules -- at the top, inside a function or under
``TYPE_CHECKING`` alike -- goes down the layers, no module imports itself round a circle (one
through a module ``__getattr__`` that imports lazily included: ``imports_of``), and no module
but ``core/threads.py`` creates a thread (there every thread gets a name and the supervisor's
signals blocked, so a signal always lands on the main thread).
"""

from __future__ import annotations

import ast
import functools
from collections import deque
from dataclasses import dataclass
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "supervisor"
ROOT = PACKAGE.name

# What each package must never import (a package may always import itself and core/).
FORBIDDEN = {
    "core": {"backends", "worker", "fleet", "ops", "ctl", "dashboard"},
    "backends": {"worker", "fleet", "ops", "ctl", "dashboard"},
    "fleet": {"worker", "ops", "ctl", "dashboard"},
    "worker": {"ops", "ctl", "dashboard"},
    "ops": {"worker", "ctl", "dashboard"},
    "dashboard": {"ctl", "worker"},
    "ctl": set(),
}
# The one module that may create threads, and the calls and base classes that create one.
THREAD_HELPER = PACKAGE / "core" / "threads.py"
THREAD_MAKERS = {"Thread", "Timer", "start_new_thread", "ThreadPoolExecutor"}


@dataclass(frozen=True)
class Import:
    """One import of one of our modules by another: ``source`` imports ``target`` at
    ``path``:``line``."""

    source: str
    target: str
    path: str  # as the report shows it: relative to the package's parent
    line: int

    def where(self) -> str:
        return f"{self.path}:{self.line}"


@functools.cache
def parsed(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), str(path))


def module_name(path: Path, package: Path = PACKAGE) -> str:
    """``supervisor/backends/sqlite/lease.py`` -> ``supervisor.backends.sqlite.lease``; a
    package's ``__init__.py`` is the package."""
    parts = list(path.relative_to(package.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def all_modules(package: Path = PACKAGE) -> dict[str, Path]:
    return {module_name(p, package): p for p in sorted(package.rglob("*.py"))}


def short(module: str) -> str:
    return module.removeprefix(ROOT + ".")


def package_of(module: str) -> str:
    """The layer a module belongs to: ``supervisor.fleet.control.sqlite`` -> ``fleet``
    (the root package itself: "")."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def lazy_getattr(path: Path) -> bool:
    """Whether the module defines a module-level ``__getattr__`` (PEP 562) that imports."""
    return any(isinstance(node, ast.FunctionDef) and node.name == "__getattr__"
               and any(isinstance(n, (ast.Import, ast.ImportFrom)) for n in ast.walk(node))
               for node in parsed(path).body)


def imports_of(module: str, path: Path, modules: dict[str, Path],
               lazy: frozenset[str] = frozenset(), package: Path = PACKAGE
               ) -> tuple[list[Import], list[str]]:
    """Every import of our package in ``path`` wherever it stands (ast.walk: function
    bodies and ``if TYPE_CHECKING:`` blocks included), resolved to the module it loads; and
    the imports that name no module of ours (a stale path after a move).

    ``from pkg import name`` loads the submodule ``pkg.name`` when there is one -- and also
    ``pkg`` itself when ``pkg`` is in ``lazy`` (it has a module-level ``__getattr__`` that
    imports): Python asks ``pkg`` for ``name`` first, so the lazy imports of its
    ``__getattr__`` (edges of ``pkg``) may run there, and a circle through them must show."""
    here = module if path.name == "__init__.py" else module.rpartition(".")[0]
    shown = str(path.relative_to(package.parent))
    found: list[Import] = []
    unresolved: list[str] = []
    for node in ast.walk(parsed(path)):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here.split(".")[:len(here.split(".")) - (node.level - 1)]
                origin = ".".join(base + ([node.module] if node.module else []))
            else:
                origin = node.module or ""
            # ``from pkg import name``: the submodule ``pkg.name`` when there is one
            targets = [f"{origin}.{a.name}" if f"{origin}.{a.name}" in modules else origin
                       for a in node.names]
            if origin in lazy:
                targets.append(origin)
        for target in targets:
            if target != ROOT and not target.startswith(ROOT + "."):
                continue  # not ours
            if target not in modules:
                unresolved.append(f"{shown}:{node.lineno} "
                                  f"imports {target}, which is no module of the package")
            elif target != module:
                found.append(Import(module, target, shown, node.lineno))
    return sorted(set(found), key=lambda i: (i.line, i.target)), unresolved


def import_graph(package: Path = PACKAGE) -> tuple[dict[str, list[Import]], list[str]]:
    """module -> its imports of our other modules, and every unresolved import."""
    modules = all_modules(package)
    lazy = frozenset(m for m, path in modules.items() if lazy_getattr(path))
    graph: dict[str, list[Import]] = {}
    unresolved: list[str] = []
    for module, path in modules.items():
        graph[module], lost = imports_of(module, path, modules, lazy, package)
        unresolved += lost
    return graph, unresolved


def layer_violations(graph: dict[str, list[Import]]) -> list[str]:
    problems = []
    for module in sorted(graph):
        layer = package_of(module)
        if layer and layer not in FORBIDDEN:
            problems.append(f"{short(module)}: package {layer}/ has no layer rule here "
                            f"(add it to FORBIDDEN and to docs/architecture.rst)")
            continue
        for imp in graph[module]:
            if package_of(imp.target) in FORBIDDEN.get(layer, set()):
                problems.append(f"{imp.where()}: {short(module)} imports {short(imp.target)} "
                                f"({layer}/ never imports {package_of(imp.target)}/)")
    return problems


def strongly_connected(graph: dict[str, list[Import]]) -> list[list[str]]:
    """Tarjan's strongly connected components of more than one module (iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted({i.target for i in graph[start]})))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            step = next(edges, None)
            if step is not None:
                if step not in index:
                    index[step] = low[step] = len(index)
                    stack.append(step)
                    on_stack.add(step)
                    work.append((step, iter(sorted({i.target for i in graph[step]}))))
                elif step in on_stack:
                    low[node] = min(low[node], index[step])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def one_circle(graph: dict[str, list[Import]], component: list[str]) -> list[Import]:
    """The shortest circle through the component's first module (BFS inside it): the
    imports to read to see the circle."""
    members = set(component)
    start = component[0]
    came_by: dict[str, Import] = {}
    todo = deque([start])
    while todo:
        node = todo.popleft()
        for imp in sorted(graph[node], key=lambda i: i.target):
            if imp.target == start:
                path = [imp]
                while path[0].source != start:
                    path.insert(0, came_by[path[0].source])
                return path
            if imp.target in members and imp.target not in came_by:
                came_by[imp.target] = imp
                todo.append(imp.target)
    raise AssertionError(f"no circle through {start} in {component}")  # not an SCC then


def import_circles(graph: dict[str, list[Import]]) -> list[str]:
    """Each circle as its modules, then one way round it: each module with the line of its
    import of the next."""
    problems = []
    for component in strongly_connected(graph):
        steps = [f"{short(i.source)} ({i.where()})" for i in one_circle(graph, component)]
        problems.append(f"{', '.join(short(m) for m in component)} import each other: "
                        f"{' -> '.join(steps)} -> {short(component[0])}")
    return problems


def thread_starts(package: Path = PACKAGE) -> list[str]:
    """Every place outside core/threads.py that creates a thread: a call of Thread, Timer,
    start_new_thread or ThreadPoolExecutor (as ``threading.X(`` or a bare ``X(``), or a
    class deriving from Thread or Timer."""
    problems = []
    for path in sorted(package.rglob("*.py")):
        if path == THREAD_HELPER:
            continue
        where = path.relative_to(PACKAGE.parent)
        for node in sorted(ast.walk(parsed(path)), key=lambda n: getattr(n, "lineno", 0)):
            if isinstance(node, ast.Call) and _name(node.func) in THREAD_MAKERS:
                problems.append(f"{where}:{node.lineno}: {ast.unparse(node.func)}(...)")
            elif isinstance(node, ast.ClassDef):
                bases = [ast.unparse(b) for b in node.bases if _name(b) in THREAD_MAKERS]
                if bases:
                    problems.append(f"{where}:{node.lineno}: class {node.name}"
                                    f"({', '.join(bases)})")
    return problems


def _name(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def test_imports_go_down_the_layers_and_round_no_circle() -> None:
    graph, unresolved = import_graph()
    problems = layer_violations(graph) + import_circles(graph) + unresolved
    if problems:
        pytest.fail("imports between supervisor's modules break the layout (docs/"
                    "architecture.rst, \"Modules\"; counted wherever the import stands, "
                    "functions and TYPE_CHECKING included):\n  " + "\n  ".join(problems),
                    pytrace=False)


def test_threads_are_started_only_by_core_threads() -> None:
    problems = thread_starts()
    if problems:
        pytest.fail("a thread made outside supervisor/core/threads.py gets neither the "
                    "supervisor's signals blocked nor always a name: use "
                    "core.threads.start_thread (or start_fast):\n  " + "\n  ".join(problems),
                    pytrace=False)


def test_a_lazy_module_getattr_hides_no_circle(tmp_path: Path) -> None:
    """The shape that once hid a circle in fleet/control/: the package's ``__getattr__``
    imports a store lazily, the store imports a table module, and the table module takes its
    siblings through the package (``from . import base``), which may run that ``__getattr__``.
    """
    package = tmp_path / ROOT
    control = package / "fleet" / "control"
    control.mkdir(parents=True)
    for folder in (package, package / "fleet"):
        (folder / "__init__.py").write_text("")
    (control / "__init__.py").write_text(
        "from .base import Seam\n\n\n"
        "def __getattr__(name):\n"
        "    if name == 'Store':\n"
        "        from .store import Store\n\n"
        "        return Store\n"
        "    raise AttributeError(name)\n")
    (control / "base.py").write_text("class Seam: ...\n")
    (control / "store.py").write_text("from .table import Table\n\n\nclass Store(Table): ...\n")
    (control / "table.py").write_text("from . import base\n\n\nclass Table(base.Seam): ...\n")
    graph, unresolved = import_graph(package)
    assert unresolved == []
    circles = import_circles(graph)
    assert len(circles) == 1, circles
    assert circles[0].startswith("fleet.control, fleet.control.store, fleet.control.table "
                                 "import each other"), circles
    # without the __getattr__ the same imports are no circle
    (control / "__init__.py").write_text("from .base import Seam\n")
    parsed.cache_clear()
    assert import_circles(import_graph(package)[0]) == []
