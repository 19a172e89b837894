"""Storage Queue: a command that cannot run goes to ``<queue>-failed`` on its first attempt,
through the same settlement decision as SQLite; ``prune`` has nothing to do (issue 25,
class 7)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.timeout(120)


def test_command_not_found_is_failed_at_once(sq):  # noqa: F811 (fixture)
    [tid] = sq.ctl("push", "-c", "no-such-command-jobq-25").stdout.split()
    sup = sq.supervisor("--exit-when-empty", "--retry-delay", "0", "--poll-interval", "0.2")
    assert sup.wait(60) == 4, sup.log()
    [rec] = sq.failed_records()
    assert (rec["id"], rec["attempts"], rec["exit_status"]) == (tid, 1, 127)
    assert rec["reason"].startswith("exit status 127: command not found, not retried")
    assert "will retry" not in sup.log()
    assert sq.count() == 0


def test_prune_says_the_service_keeps_no_succeeded_tasks(sq):  # noqa: F811 (fixture)
    res = sq.ctl("prune", check=False)
    assert res.returncode == 2 and res.stdout == ""
    assert res.stderr.splitlines() == [
        "jobq-ctl: error: prune: storage-queue keeps no succeeded tasks (a message is deleted "
        "once its task succeeded): nothing to prune"]
