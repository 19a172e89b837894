"""Every "finished" line names the attempt, in its text and as a field (issue 14, item 8)."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from test_settlement import Harness, settled

pytestmark = pytest.mark.timeout(30)


@pytest.mark.parametrize(("rc", "requests"), [
    (0, {}),  # succeeded
    (1, {}),  # failed, retried
    (1, {"lock_loss_handled": True}),  # finished after its lock was lost
])
def test_finished_line_names_the_attempt(caplog: pytest.LogCaptureFixture, rc: int,
                                         requests: dict[str, Any]) -> None:
    h = Harness(max_attempts=4)
    rt = h.finished(rc, attempt=2, **requests)
    with caplog.at_level(logging.INFO, logger="jobq.worker"):
        h.settlement.conclude(rt, h.clock.now, stopping=False)
    settled(rt.keeper)
    [line] = [r for r in caplog.records if r.getMessage().startswith("finished")]
    assert "attempt 2 of 4" in line.getMessage()
    assert getattr(line, "attempt", None) == 2
