"""Every worker option is documented in conf/worker.ini (and, generated from the parsers, in
docs/reference/); the pages say what a new operator needs."""

from __future__ import annotations

import re
from pathlib import Path

from supervisor.core.config_file import CLI_ONLY_ATTR
from supervisor.worker.main import worker_parser

REPO = Path(__file__).resolve().parents[2]


def _options() -> list[str]:
    names = []
    for action in worker_parser()._actions:
        longs = [o for o in action.option_strings if o.startswith("--")]
        if getattr(action, CLI_ONLY_ATTR, False):  # --check-config: no key of the file
            continue
        if longs and longs[0] not in ("--help", "--version"):
            names.append(longs[0][2:])
    return names


def test_worker_ini_documents_every_option():
    ini = (REPO / "conf" / "worker.ini").read_text()
    keys = set(re.findall(r"^#?\s*([a-z][a-z0-9-]+)\s*=", ini, re.MULTILINE))
    missing = [n for n in _options() if n not in keys and n not in ("config",)]
    assert not missing, f"conf/worker.ini lacks {missing}"


ARCHITECTURE = REPO / "docs" / "architecture.rst"
MAX_ARCHITECTURE_LINES = 300  # a map read at one sitting; detail goes to the other pages


def named_on(page: str) -> set[str]:
    """Every path the page names as an inline literal, ``dir/{a,b}.py`` standing for
    ``dir/a.py`` and ``dir/b.py`` -- and for ``dir/``, the package it lists."""
    names = set()
    for literal in re.findall(r"``([^`]+)``", page):
        group = re.fullmatch(r"([\w/]+/)\{([\w,]+)\}(\.py)", literal)
        if group:
            prefix, stems, suffix = group.groups()
            names.add(prefix)
            names.update(prefix + stem + suffix for stem in stems.split(","))
        else:
            names.add(literal)
    return names


def test_architecture_page_names_every_package_and_module():
    """docs/architecture.rst stays the map: every package of supervisor/ is on it as
    ``path/`` and every module as ``path/name.py`` or in a group ``path/{name,...}.py``
    (relative to supervisor/), and every docs page it links to exists."""
    page = ARCHITECTURE.read_text()
    root = REPO / "supervisor"
    packages = sorted(p.parent.relative_to(root).as_posix() + "/"
                      for p in root.rglob("__init__.py") if p.parent != root)
    modules = sorted(p.relative_to(root).as_posix() for p in root.rglob("*.py")
                     if p.name not in ("__init__.py", "__main__.py"))
    named = named_on(page)
    missing = [name for name in packages + modules if name not in named]
    assert not missing, f"docs/architecture.rst does not name {missing}"
    linked = re.findall(r"<([a-z_-]+\.rst)>`_", page)
    assert linked and all((REPO / "docs" / name).is_file() for name in linked), linked
    assert "docs/architecture.rst" in (REPO / "README.rst").read_text()


def test_brace_groups_name_each_module_of_the_group():
    page = "see ``backends/sqlite/{backend,lease}.py`` and ``core/task.py``"
    assert named_on(page) == {"backends/sqlite/", "backends/sqlite/backend.py",
                              "backends/sqlite/lease.py", "core/task.py"}


def test_architecture_page_stays_short():
    """Issue 27: the map stays at most ~300 lines; what does not fit belongs on
    docs/backends.rst, docs/fleet.rst or docs/reliability.rst, linked from it."""
    lines = len(ARCHITECTURE.read_text().splitlines())
    assert lines <= MAX_ARCHITECTURE_LINES, (
        f"docs/architecture.rst has {lines} lines (at most {MAX_ARCHITECTURE_LINES}): move "
        f"detail to docs/backends.rst, docs/fleet.rst or docs/reliability.rst")


def test_no_reference_to_a_design_file_outside_the_repository():
    hits = [str(p.relative_to(REPO)) for d in ("supervisor", "tests", "scripts")
            for p in (REPO / d).rglob("*.py") if "DESIGN" + ".md" in p.read_text()]
    assert not hits, hits


def page(name: str) -> str:
    return (REPO / "docs" / name).read_text()


def test_docs_say_what_a_new_operator_needs():
    """Issue 14: the command length limit, jobq-ctl's exit statuses, the reserved variables,
    and an Azurite command that does not phone home -- each on its page."""
    from supervisor.core.task import MAX_COMMAND_BYTES

    assert f"{MAX_COMMAND_BYTES // 1024} KiB" in page("tasks.rst")
    assert "Exit status of ``jobq-ctl``" in page("troubleshooting.rst")
    assert "``--env`` cannot set ``JOBQ_TASK_ID``" in page("tasks.rst")
    texts = [(REPO / "README.rst").read_text()] + [
        p.read_text() for p in sorted((REPO / "docs").rglob("*.rst"))]
    azurite = [line for text in texts for line in text.splitlines() if "bin/azurite-queue" in line]
    assert azurite and all("--disableTelemetry" in line for line in azurite)


def test_readme_stays_short_and_names_no_package_index_install():
    """Issue 31: the README is a front page (at most 250 lines) that links into docs/, and no
    page tells a reader to ``pip install`` a distribution name that is not on PyPI."""
    readme = (REPO / "README.rst").read_text()
    assert len(readme.splitlines()) <= 250
    for name in ("getting-started", "tasks", "backends", "scheduling", "fleet", "dashboard",
                 "production", "security", "troubleshooting", "from-ai4s-jobq", "benchmarks"):
        assert f"<docs/{name}.rst>`_" in readme, name
        assert (REPO / "docs" / f"{name}.rst").is_file(), name
    texts = [readme] + [p.read_text() for p in sorted((REPO / "docs").rglob("*.rst"))]
    assert not [t for t in texts if re.search(r"pip install\s+'?jobq-supervisor", t)]
