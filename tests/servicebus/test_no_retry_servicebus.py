"""Service Bus: a command that cannot run is dead-lettered on its first delivery, through the
same settlement decision as SQLite (issue 25, class 7)."""

from __future__ import annotations

import pytest

from .broker import DEAD_LETTER

pytestmark = pytest.mark.timeout(120)


def test_command_not_found_is_dead_lettered_at_once(sb_env):
    broker = sb_env.broker
    (task_id,) = sb_env.push("no-such-command-jobq-25")
    sup = sb_env.supervisor("--retry-delay", "0", "--exit-when-empty")
    assert sup.wait(30) == 4, sup.log()
    (dead,) = broker.messages("work", DEAD_LETTER)
    assert dead.dead_letter_reason.startswith("exit status 127: command not found, not retried")
    assert dead.dead_letter_reason.endswith("attempt 1 of 5")
    (record,) = sb_env.failed_json()
    assert (record["id"], record["attempts"], record["exit_status"]) == (task_id, 1, 127)
    assert "will retry" not in sup.log()
