"""The ``jobq-ctl`` parser: global options, one sub-command per handler of commands.py, the
fleet commands' arguments (main thread, once per run; also read by the docs' options reference
and the tests).  The entry point and the dispatch are main.py's."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from ..core.build import VersionAction
from ..core.options import _duration, _Parser, add_backend_options, jobq_parser
from ..worker.main import worker_parser
from .actions_command import add_actions_arguments
from .tasks_command import add_tasks_arguments
from .watch import add_watch_option


def ctl_parser() -> _Parser:
    p = jobq_parser("jobq-ctl", "Push tasks, inspect or repair a queue, and control its workers.",
                    ["--config"], "the worker's INI config file, backend and queue are read",
                    ignore_unknown_config_file_keys=True)
    # the INI file is the worker's: its keys, checked as the worker checks them; jobq-ctl
    # passes over those it has no use for
    p.ini_owner = worker_parser
    p.add_argument("--version", action=VersionAction)
    add_backend_options(p)
    # also here, so JOBQ_SIGNING_KEY_FILE and a shared worker INI apply (sub-parsers read
    # neither); push and the control commands sign with the first key: list the newest first
    p.add_argument("--signing-key-file", action="append", metavar="PATH", path=True,
                   help="push: sign tasks; cancel/pause/resume/drain/stop: sign the control "
                        "records, with this key (env/INI: comma-separated list)")
    # also here, so that the worker's JOBQ_RETENTION / INI ``retention`` is prune's default
    p.add_argument("--retention", type=_duration,
                   help="prune: the age past which succeeded tasks go (default 7d; the "
                        "worker's option of the same name)")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", help="one of:")
    sub.required = True

    def cmd(name: str, help_text: str, signs: bool = False) -> argparse.ArgumentParser:
        sp = sub.add_parser(name, help=help_text, description=help_text, epilog=None)
        add_backend_options(sp, suppress=True)
        # after the command too: the file is read from anywhere in argv (configargparse)
        sp.add_argument("--config", default=argparse.SUPPRESS, metavar="PATH",
                        help="the worker's INI config file (also before the command)")
        if signs:
            sp.add_argument("--signing-key-file", action="append", default=argparse.SUPPRESS,
                            metavar="PATH", help="sign with this key (the first one given)")
        return sp

    push = cmd("push", "push tasks; prints one task id per line", signs=True)
    push.add_argument("-c", "--command", dest="commands", action="append", default=[],
                      help="shell command (repeatable)")
    push.add_argument("--file", help="one command per line ('-' = stdin)")
    push.add_argument("--max-attempts", dest="task_max_attempts", type=int, default=None,
                      help="attempts for these tasks (default: the worker's --max-attempts)")
    push.add_argument("--env", action="append", default=[], metavar="K=V",
                      help="environment variable for the tasks (repeatable; not the JOBQ_ "
                           "variables the worker sets)")
    push.add_argument("--cwd", default=None,
                      help="working directory of the tasks, an absolute path on the "
                           "workers' hosts (default: the worker's)")
    # -- scheduling (push_command.push_schedule; docs/scheduling.rst says which backend has which)
    push.add_argument("--priority", type=int, default=None, metavar="N",
                      help="0..9, higher first (default 5); SQLite and PostgreSQL")
    when = push.add_mutually_exclusive_group()
    when.add_argument("--delay", type=_duration, default=None, metavar="DURATION",
                      help="start no sooner than this long after the push (e.g. 90s, 2h)")
    when.add_argument("--not-before", default=None, metavar="ISO-8601",
                      help="start no sooner than this time (no zone: UTC)")
    push.add_argument("--timeout", default=None, metavar="DURATION",
                      help="this task's time limit; the worker applies the smaller of it and "
                           "its --task-time-limit")
    once = push.add_mutually_exclusive_group()
    once.add_argument("--unique-key", default=None, metavar="KEY",
                      help="skip the push while a task with this key is pending or running "
                           "(prints that task's id)")
    once.add_argument("--unique", action="store_true",
                      help="--unique-key of a hash of each task's command, env and cwd")
    # -- task output (output_commands.py): push --wait/--follow, logs
    push.add_argument("--wait", action="store_true",
                      help="after printing the ids, wait until every task ended for good; "
                           "one result line each on stderr; exit 0 if all succeeded, else 1")
    push.add_argument("--follow", action="store_true",
                      help="--wait, streaming the tasks' output to stdout (each line behind "
                           "'<id>: ' when several)")
    lg = cmd("logs", "print a task's output as it was printed (stdout, raw)")
    lg.add_argument("id", metavar="ID", help="task id (as push prints it)")
    which = lg.add_mutually_exclusive_group()
    which.add_argument("--attempt", type=int, default=None, metavar="N",
                       help="this attempt (default: the latest)")
    which.add_argument("--all", action="store_true",
                       help="every attempt, each after a '== attempt N ==' line on stderr")
    lg.add_argument("-f", "--follow", action="store_true",
                    help="follow the attempt live (waits for a task not started yet; goes on "
                         "to the next attempt of a retried task) and print how it ended on "
                         "stderr")
    lg.add_argument("--tail", type=int, default=None, metavar="N",
                    help="only the last N lines")
    cmd("size", "number of pending tasks")
    st = cmd("status", "counts per state, the running tasks, the oldest pending task's age "
                       "and whether the queue is paused")
    st.add_argument("--json", action="store_true", help="print JSON")
    add_watch_option(st)
    pk = cmd("peek", "show the next pending tasks")
    pk.add_argument("-n", type=int, default=10, help="how many tasks to show")
    pk.add_argument("--json", action="store_true", help="print JSON")
    fl = cmd("failed", "list failed (dead-lettered) and cancelled tasks")
    fl.add_argument("--json", action="store_true", help="print JSON")
    add_tasks_arguments(cmd("tasks", "list the queue's tasks, newest first, a page at a time "
                                     "(filters: state, worker, text in the command)"))
    rq = cmd("requeue", "move failed tasks back to pending")
    rq.add_argument("ids", nargs="*", help="ids of failed tasks (as push and failed print them)")
    rq.add_argument("--all-failed", action="store_true",
                    help="requeue every failed task, not the cancelled ones")
    rq.add_argument("--include-cancelled", action="store_true",
                    help="with --all-failed: the cancelled tasks too")
    cl = cmd("clear", "delete pending tasks (or, with --failed, failed ones)")
    cl.add_argument("--failed", action="store_true", help="delete failed tasks instead")
    pr = cmd("prune", "SQLite, PostgreSQL: delete succeeded tasks older than --retention now "
                      "(workers do it every --reaper-interval); failed and cancelled tasks are "
                      "kept")
    pr.add_argument("--retention", type=_duration, default=argparse.SUPPRESS,
                    help="as before the command")
    pr.add_argument("--older-than", type=_duration, default=None, metavar="DURATION",
                    help="this age instead of --retention (e.g. 1d, 12h; 0: every succeeded "
                         "task)")
    mg = cmd("migrate", "PostgreSQL: create or upgrade the schema of --postgres-schema "
                        "(safe while workers run and when several hosts run it at once)")
    mg.add_argument("--print", action="store_true",
                    help="print the SQL instead (for a DBA to apply, e.g. with psql); "
                         "connects to nothing")
    _add_fleet_commands(cmd)
    # -- dashboard (supervisor/dashboard/) --
    db = cmd("dashboard", "serve a web view of the queue and its workers (needs the "
                          "'dashboard' extra); read-only unless --token-file", signs=True)
    db.add_argument("--bind", default="127.0.0.1:8080", metavar="HOST:PORT",
                    help="where to listen (default 127.0.0.1:8080; port 0: any free port); "
                         "a non-loopback address needs --token-file")
    db.add_argument("--token-file", default=None, metavar="PATH",
                    help="a file whose first line is the operators' token: with it, the "
                         "buttons (pause/resume, drain/stop) work after a login")
    db.add_argument("--session-idle-timeout", type=_duration, default=None,
                    metavar="DURATION",
                    help="a login ends after this long without a page loaded or a button "
                         "pressed (the page's own refreshes do not count); default 30m")
    db.add_argument("--session-max-age", type=_duration, default=None, metavar="DURATION",
                    help="a login ends this long after it was made, however busy; default "
                         "12h")
    db.add_argument("--allowed-hosts", default="", metavar="NAME,NAME",
                    help="host names the dashboard answers besides the address it is bound "
                         "to (and loopback names when that is loopback), e.g. a reverse "
                         "proxy's public name; any other Host header is refused (400)")
    db.add_argument("--secure-cookies", action="store_true",
                    help="send the login cookie over HTTPS only (behind a reverse proxy that "
                         "terminates TLS)")
    db.add_argument("--sample-interval", type=_duration, default=15.0,
                    help=argparse.SUPPRESS)  # the depth sampler's period (tests)
    return p


def _add_fleet_commands(cmd: Callable[..., argparse.ArgumentParser]) -> None:
    wk = cmd("workers", "the queue's live workers and the tasks each runs")
    wk.add_argument("--json", action="store_true", help="print JSON")
    wk.add_argument("--all", action="store_true",
                    help="also list lost workers (no heartbeat for 3 intervals)")
    add_watch_option(wk)
    cn = cmd("cancel", "cancel tasks: a pending one never runs, a running one is stopped",
             signs=True)
    cn.add_argument("ids", nargs="+", metavar="ID", help="task ids (as push prints them)")
    cn.add_argument("--reason", default="", help="why (shown with the cancelled task)")
    cn.add_argument("--any-id", action="store_true",
                    help="Azure: cancel an id that is not shaped like one jobq-ctl or ai4s-jobq "
                         "makes (32 hex digits, a GUID): a hand-written body's own id")
    how = cn.add_mutually_exclusive_group()
    how.add_argument("--grace", type=_duration, default=30.0, metavar="DURATION",
                     help="SIGTERM, then SIGKILL after this long (default 30s)")
    how.add_argument("--now", action="store_true", help="SIGKILL at once (--grace 0)")
    # default None: CANCEL_TTL (fleet_commands.py; its module is not imported to build this)
    cn.add_argument("--cancel-ttl", type=_duration, default=None, metavar="DURATION",
                    help="how long the cancel applies, also to a task no worker has received "
                         "yet (Azure has no index of task ids); default and at most 7d")
    cmd("pause", "no worker of the queue starts a new task; running ones go on", signs=True)
    cmd("resume", "workers of the queue start tasks again", signs=True)
    dr = cmd("drain", "the worker takes no new task, finishes its tasks and exits 0",
             signs=True)
    dr.add_argument("workers", nargs="+", metavar="WORKER", help="worker ids (jobq-ctl workers)")
    sp = cmd("stop", "the worker stops its tasks (requeued, no attempt lost) and exits 0",
             signs=True)
    sp.add_argument("workers", nargs="+", metavar="WORKER", help="worker ids (jobq-ctl workers)")
    # result (result_command.py): one block, beside the other commands of the control store
    rs = cmd("result", "the result of each attempt of a task: state, exit status or signal, "
                       "worker, start and end (from the control store, any backend)")
    rs.add_argument("id", metavar="ID", help="a task id (as push prints it)")
    rs.add_argument("--json", action="store_true", help="print JSON: a list, one object per "
                    "attempt")
    add_actions_arguments(cmd("actions", "the newest operator actions (jobq-ctl's and the "
                                         "dashboard's): who, when, what, on which tasks"))
