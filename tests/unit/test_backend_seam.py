"""The Backend seam holds outside ``supervisor/backends/`` (issue 27): no code branches on a
backend's name (``backend.name == "sqlite"``) -- what a queue can do is a typed member of
Backend (``admin()``, ``requeue_chunk``, the capability flags) -- and nothing calls a
private attribute of a backend (``backend._query``).  A walk of every module's syntax tree;
no imports, no processes."""

from __future__ import annotations

import ast
from pathlib import Path

from supervisor.core.settings import BACKENDS

PACKAGE = Path(__file__).resolve().parents[2] / "supervisor"


def _names(node: ast.expr) -> set[str]:
    """The backend names ``node`` spells: a string, or a tuple/list/set of them."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value} & set(BACKENDS)
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return {n for e in node.elts for n in _names(e)}
    return set()


def _is_name_attr(node: ast.expr) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == "name"


def _receiver_name(node: ast.expr) -> str:
    """What the object a call is made on is called: ``backend``, ``self.backend``,
    ``self.backend()`` all say "backend"."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Call):
        return _receiver_name(node.func)
    return ""


def violations(source: str, where: str) -> list[str]:
    """Each ``.name`` compared with a backend name, and each call of a ``_private``
    attribute of something named backend, in ``source`` (``where``: its path, for the
    message)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(_is_name_attr(s) for s in sides) and any(_names(s) for s in sides):
                found.append(f"{where}:{node.lineno}: compares .name with a backend name "
                             f"({ast.unparse(node)})")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            attr = node.func.attr
            private = attr.startswith("_") and not attr.endswith("__")
            if private and "backend" in _receiver_name(node.func.value).lower():
                found.append(f"{where}:{node.lineno}: calls a private attribute of a backend "
                             f"({ast.unparse(node.func)})")
    return found


def test_no_backend_name_branch_nor_private_call_outside_backends() -> None:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE)
        if rel.parts[0] == "backends":
            continue
        found += violations(path.read_text(encoding="utf-8"), f"supervisor/{rel}")
    assert found == []


def test_the_walk_finds_each_kind_of_violation() -> None:
    """The checker itself: each form a branch on a backend or a private call takes is
    found, and what is allowed is not."""
    planted = '''
if backend.name == "sqlite": pass
if "servicebus" != self.backend().name: pass
if b.name in ("storage-queue", "servicebus"): pass
rows = backend._query("SELECT 1")
rows = self.backend()._query("SELECT 1")
rows = data.backend._tx()
'''
    allowed = '''
if f.name == "tasks": pass
if store.name == "azure-table": pass
if settings.backend == "sqlite": pass
admin = backend.admin()
backend.__enter__()
self._client("backend", opener, "queue")
'''
    assert [v.split(": ", 1)[0] for v in violations(planted, "x")] == [
        "x:2", "x:3", "x:4", "x:5", "x:6", "x:7"]
    assert violations(allowed, "y") == []


def test_indexed_names_the_backends_whose_admin_answers() -> None:
    """``backends.INDEXED`` (what jobq-ctl opens for cancel and result before it has a
    backend to ask) is exactly the backend classes that override ``admin()``."""
    from supervisor.backends import INDEXED
    from supervisor.backends.base import BackendBase
    from supervisor.backends.postgres.backend import PostgresBackend
    from supervisor.backends.servicebus.backend import ServiceBusBackend
    from supervisor.backends.sqlite.backend import SqliteBackend
    from supervisor.backends.storage_queue.backend import StorageQueueBackend

    classes = {"sqlite": SqliteBackend, "storage-queue": StorageQueueBackend,
               "servicebus": ServiceBusBackend, "postgres": PostgresBackend}
    assert set(classes) == set(BACKENDS)
    assert {name for name, cls in classes.items()
            if cls.admin is not BackendBase.admin} == set(INDEXED)
