"""Sphinx side of the generated reference (docs/conf.py loads it).

* ``.. jobq-reference:: jobq-supervisor`` (or ``jobq-ctl``): the command's synopsis, its
  description (the parser's, then the directive's content) and every option, written by
  jobq_options.py from the real parser when the page is read, so the reference cannot drift
  from the code.  A page holding it is read again on every build (env-get-outdated): Sphinx
  does not know that the page depends on the code.  An option without help text is a
  warning (an error under ``-W``).
* A link written as a file (```Architecture <architecture.rst>`_``, as GitHub shows the
  pages) becomes a reference to that document: it works on the site and, with ``-n``, a page
  that does not exist is a warning (an error under ``-W``), like any broken reference.
"""

from __future__ import annotations

import re
from typing import Any

import jobq_options
from docutils import nodes
from docutils.statemachine import StringList
from sphinx import addnodes
from sphinx.application import Sphinx
from sphinx.environment import BuildEnvironment
from sphinx.util import logging
from sphinx.util.docutils import SphinxDirective
from sphinx.util.nodes import nested_parse_with_titles

logger = logging.getLogger(__name__)
_FILE_LINK = re.compile(r"^(?![a-z][a-z0-9+.-]*:)(?!/)([\w./-]+)\.rst$")


class JobqReference(SphinxDirective):
    """The generated reference of one command (its name, the directive's one argument)."""

    required_arguments = 1
    has_content = True  # the page's own description, after the parser's

    def run(self) -> list[nodes.Node]:
        command = self.arguments[0]
        if command not in jobq_options.COMMANDS:
            raise self.error(f"jobq-reference: unknown command {command!r} "
                             f"(one of {', '.join(jobq_options.COMMANDS)})")
        self.env.metadata[self.env.docname]["jobq-reference"] = command
        for option in jobq_options.missing_help(jobq_options.parser_of(command)):
            logger.warning("option without help text: %s", option, location=self.get_location())
        text = jobq_options.render(command, list(self.content))
        source = f"<generated reference of {command}>"
        content = StringList(text.splitlines(), source=source)
        container = nodes.section()
        container.document = self.state.document
        nested_parse_with_titles(self.state, content, container)
        return list(container.children)


def _outdated(app: Sphinx, env: BuildEnvironment, added: set[str], changed: set[str],
              removed: set[str]) -> list[str]:
    """The reference pages, read again on every build: they depend on the code, which
    Sphinx does not track (reading them takes milliseconds)."""
    return [doc for doc, meta in env.metadata.items() if "jobq-reference" in meta]


def _file_links(app: Sphinx, doctree: nodes.document) -> None:
    """```text <page.rst>`_`` -> a :doc: reference to ``page`` (relative to this page)."""
    for ref in list(doctree.findall(nodes.reference)):
        match = _FILE_LINK.match(ref.get("refuri", ""))
        if not match:
            continue
        xref = addnodes.pending_xref("", refdomain="std", reftype="doc",
                                     reftarget=match.group(1), refexplicit=True,
                                     refwarn=True, refdoc=app.env.docname)
        xref += nodes.inline(ref.astext(), ref.astext())
        ref.replace_self(xref)


def setup(app: Sphinx) -> dict[str, Any]:
    app.add_directive("jobq-reference", JobqReference)
    app.connect("env-get-outdated", _outdated)
    app.connect("doctree-read", _file_links)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
