"""The ``jobq-ctl`` command line: its entry point and dispatch (main thread); the parser is
parser.py's.

The queue commands (push, size, peek, failed, requeue, clear) run on a Backend
(push_command.py, queue_commands.py); the fleet commands (workers, cancel, pause, resume,
drain, stop; status) also on the control store (fleet_commands.py, docs/architecture.rst
"The fleet layer"); ``logs`` and ``push --wait/--follow`` on the output store and the result
records (output_commands.py).  What each opens: clients.py; which handler runs: commands.py,
which imports that handler's module only (start-up CPU: the stores' modules are imported by
the commands that open a store, never here).  Errors are one line: exit 2 for a usage or
configuration error, 1 for a queue or store that cannot be reached.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import io
import json
import logging
import sys
from dataclasses import replace

from ..backends.base import BackendConfigError, BackendError, QueueNotFound
from ..core.options import (
    UsageError,
    _parse,
    usage_failed,
)
from ..core.settings import EXIT_UNEXPECTED, Settings
from ..core.shown import ShownFormatter
from .clients import Clients, open_clients
from .commands import COMMANDS, OPENS_OWN, handler
from .guards import refuse_before_opening, refuse_short_config
from .parser import ctl_parser
from .stdout import run_quietly


def _error(text: str) -> int:
    print(f"jobq-ctl: error: {text}", file=sys.stderr)
    return EXIT_UNEXPECTED


def ctl_entry(argv: list[str] | None = None) -> int:
    """The ``jobq-ctl`` command (main thread): ``ctl_main``; a reader of its stdout that went
    away (``| head``) ends it quietly (stdout.py).  First: the credentials go from ``ps``'s
    view of the command line and what it creates is private (as ``worker_entry``)."""
    from ..core import file_modes
    from ..core.argv_secrets import wipe_argv_secrets

    wipe_argv_secrets()
    file_modes.restrict()
    code = run_quietly(ctl_main, argv)
    # The command is done: what is left is the interpreter's exit, whose last collection
    # walks every object of the modules loaded (psycopg, the stores): 0.1-0.35 s between
    # ``push --wait``'s last line and its exit on a busy machine (issue 41 §4).  Frozen,
    # they are still freed by their counts at exit; only that walk is skipped.
    gc.freeze()
    return code


def ctl_main(argv: list[str] | None = None) -> int:
    """Entry point of ``jobq-ctl`` (main thread)."""

    argv = sys.argv[1:] if argv is None else argv
    try:
        parser = ctl_parser()
        refuse_short_config(argv, COMMANDS)
        ns = _parse(parser, argv)
        ns.worker_id = "jobq-ctl"
        settings = parser.settings(ns)
    except UsageError as exc:
        return usage_failed("jobq-ctl", str(exc))
    from ..core import file_modes

    file_modes.configure(settings.group_readable)
    handler = logging.StreamHandler()  # the dashboard's lines show ids from messages: shown
    handler.setFormatter(ShownFormatter("jobq-ctl: %(message)s"))
    logging.basicConfig(level=logging.WARNING, handlers=[handler])
    if len(settings.queues) > 1 and ns.command != "dashboard":  # it serves each queue
        if ns.command != "status":
            return usage_failed("jobq-ctl", f"--queue: {ns.command} takes one queue (only "
                                            f"status and dashboard take several)")
        if ns.watch is not None:
            return usage_failed("jobq-ctl", "--watch: status --watch takes one queue")
        return _status_each(ns, settings)
    return _run(ns, settings)


def _status_each(ns: argparse.Namespace, settings: Settings) -> int:
    """``status --queue high,low``: each queue's status in turn, under a line naming it
    (``--json``: one object, queue name -> that queue's status) (main thread)."""
    rc, data = 0, {}
    for name in settings.queues:
        one = argparse.Namespace(**{**vars(ns), "queue": name})
        if ns.json:
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                code = _run(one, replace(settings, queue=name))
            data[name] = json.loads(out.getvalue()) if code == 0 else None
        else:
            print(f"== queue {name}", flush=True)
            code = _run(one, replace(settings, queue=name))
        rc = max(rc, code)
    if ns.json:
        print(json.dumps(data, indent=2, sort_keys=True))
    return rc


def _store_failed(exc: Exception) -> int:
    """A control or output store's error: exit 2 for its configuration, else 1; anything else
    is raised again.  Their modules are imported here, not at start-up: only a command that
    opened a store (and so imported them already) can have raised one (main thread)."""
    from ..fleet.control.base import ControlConfigError, ControlStoreError
    from ..fleet.output.base import OutputConfigError, OutputStoreError

    if isinstance(exc, (ControlConfigError, OutputConfigError)):
        return usage_failed("jobq-ctl", str(exc))
    if isinstance(exc, (ControlStoreError, OutputStoreError)):
        return _error(str(exc))
    raise exc


def _run(ns: argparse.Namespace, settings: Settings) -> int:
    """One command on one queue (main thread)."""
    run = handler(ns.command)
    clients: Clients | None = None
    try:
        if ns.command in OPENS_OWN:
            return run(ns, Clients(settings))
        refuse_before_opening(ns, settings)
        clients = open_clients(ns, settings)
        return run(ns, clients)
    except QueueNotFound as exc:  # like a missing SQLite file or Storage Queue: exit 1
        return _error(str(exc))
    except (UsageError, BackendConfigError) as exc:
        return usage_failed("jobq-ctl", str(exc))
    except BackendError as exc:
        return _error(str(exc))
    except KeyboardInterrupt:
        return 130  # quietly, like any command line tool
    except Exception as exc:
        return _store_failed(exc)
    finally:
        if clients is not None:
            clients.close()
