"""Tasks that cannot run are failed at once, saying why (issue 25, class 7): the exit statuses
of ``--no-retry-exit-codes`` and a spawn that failed for the task's own reasons."""

from __future__ import annotations

import errno
import signal

import pytest
from test_settlement import Harness, settled

from supervisor.worker.settlement import spawn_not_retried
from tests.fakes.worker import make_task

pytestmark = pytest.mark.timeout(30)


@pytest.mark.parametrize(("rc", "meaning"), [(127, "command not found"),
                                             (126, "command cannot execute")])
def test_command_that_cannot_run_is_failed_on_its_first_attempt(rc: int, meaning: str) -> None:
    h = Harness(max_attempts=5)
    calls = h.conclude(rc, attempt=1, output="bash: nosuch: command not found\n")
    assert calls == [("dead_letter", f"exit status {rc}: {meaning}, not retried "
                      "(--no-retry-exit-codes); attempt 1 of 5",
                      "bash: nosuch: command not found\n", rc)]
    assert h.settlement.counts == h.counts(failed=1)
    assert h.settlement.awaiting_return == {}  # nothing comes back: --exit-when-empty ends


def test_the_set_is_the_operators() -> None:
    h = Harness(max_attempts=5, no_retry_exit_codes=(3,))
    assert h.conclude(3) == [("dead_letter", "exit status 3: not retried "
                              "(--no-retry-exit-codes); attempt 1 of 5", "", 3)]
    assert h.conclude(127) == [("release", True, 10.0)]  # no longer in the set: retried
    empty = Harness(max_attempts=5, no_retry_exit_codes=())  # empty: every status retried
    assert empty.conclude(126) == [("release", True, 10.0)]


def test_a_status_the_worker_caused_is_retried() -> None:
    """A time limit's kill is the worker's doing, whatever status the shell then returns."""
    h = Harness(max_attempts=5)
    assert h.conclude(127, term_reason="time limit") == [("release", True, 10.0)]
    assert h.conclude(128 + signal.SIGKILL) == [("release", True, 10.0)]


@pytest.mark.parametrize(("exc", "retried"), [
    (FileNotFoundError(errno.ENOENT, "No such file or directory", "/gone"), False),
    (NotADirectoryError(errno.ENOTDIR, "Not a directory", "/etc/passwd"), False),
    (PermissionError(errno.EACCES, "Permission denied", "/root"), False),
    (ValueError("embedded null byte"), False),
    (OSError(errno.EAGAIN, "Resource temporarily unavailable"), True),
    (OSError(errno.ENOMEM, "Cannot allocate memory"), True),
    (OSError(errno.EMFILE, "Too many open files"), True),
])
def test_spawn_failures_are_final_unless_the_worker_ran_short(exc: Exception,
                                                              retried: bool) -> None:
    assert (spawn_not_retried(exc) is None) is retried


def test_a_final_spawn_failure_is_dead_lettered_at_once() -> None:
    h = Harness(max_attempts=5)
    keeper = make_task(h.clock).keeper
    h.settlement.failed(keeper, "t1", 1, 5, "spawn failed: No such file or directory (cwd /x)"
                        ": the task cannot start, not retried", "", None, retry=False)
    assert settled(keeper) == [("dead_letter", "spawn failed: No such file or directory "
                                "(cwd /x): the task cannot start, not retried; attempt 1 of 5",
                                "", None)]
    assert h.settlement.counts == h.counts(failed=1)
