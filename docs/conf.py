"""Sphinx configuration of the jobq-supervisor docs site (scripts/docs builds it: HTML into
build/docs/html, the man pages jobq-supervisor(1) and jobq-ctl(1) into build/docs/man)."""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "_ext"))  # jobq_reference, jobq_options

from supervisor import __version__  # noqa: E402  (the installed package, as scripts/docs runs it)

project = "jobq-supervisor"
author = "the jobq-supervisor authors"
copyright = "the jobq-supervisor authors"  # noqa: A001  (Sphinx's name)
version = release = __version__

extensions = ["jobq_reference", "sphinx_copybutton"]
root_doc = "index"
exclude_patterns = ["_build", "_fragments"]  # included by pages, no pages of their own
nitpicky = True
highlight_language = "bash"  # most blocks are commands
# ... and the others (tables of figures, output, INI text) are highlighted as well as bash's
# lexer can, in its relaxed mode: a block that is no shell is no error.
suppress_warnings = ["misc.highlighting_failure"]
# Smart quotes and ellipses, but no dashes: "--queue-order" in a help text became an en dash
# ("–queue-order"), and an option copied from the page did not work.
smartquotes_action = "qe"

# Furo: code blocks scroll instead of being clipped at 80 columns, a copy button on each
# (sphinx_copybutton), a page a phone can read.
html_theme = "furo"
html_title = f"jobq-supervisor {release}"
html_static_path: list[str] = []

# One man page per command, from the same generated reference as the HTML pages.
man_pages = [
    ("reference/jobq-supervisor", "jobq-supervisor",
     "run shell tasks from a queue under renewed leases", [], 1),
    ("reference/jobq-ctl", "jobq-ctl",
     "push tasks, inspect or repair a queue, and control its workers", [], 1),
]
man_show_urls = False
