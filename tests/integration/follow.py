"""Acceptance 1 of issue 16 on any backend: ``logs -f`` live, started before and while the
task runs.  Shared by the SQLite, Storage Queue and Service Bus versions
(tests/integration/test_output_e2e.py, tests/azure/test_output_storage_queue.py,
tests/servicebus/test_output_servicebus.py): only how a command reaches the queue differs."""

from __future__ import annotations

import signal
from collections.abc import Callable, Sequence

from tests.conftest import Supervisor, command, wait_for
from tests.integration.captured import Captured

LINES = 50
# a line every 100 ms (the time it was printed), then an exit status a follower must report
STAMPS = f"for i in $(seq 1 {LINES}); do date +%s.%N; sleep 0.1; done; exit 4"
BOUND = 3.0  # s from a line's printing to its arrival at a follower (the bound)


def Follow(args: Sequence[str], env: dict[str, str], cwd: str) -> Captured:  # noqa: N802
    """A running jobq-ctl with these arguments, its output lines collected (captured.py)."""
    return Captured.start([*command("jobq-ctl"), *args], env=env, cwd=cwd)


def _lags(f: Follow, since: float = 0.0) -> list[float]:
    """For each stamp line the follower printed: arrival minus printing, for the lines
    printed after ``since`` (epoch)."""
    lags = []
    for arrived, line in f.out:
        printed = float(line)
        if printed >= since:
            lags.append(arrived - printed)
    return lags


def check_live_follow(start: Callable[..., Follow], push: Callable[[str], str],
                      worker: Callable[[], Supervisor], lines: int = LINES) -> None:
    """Acceptance 1 on any backend: ``logs -f`` started before the task starts waits, then
    shows each line within BOUND of its printing; one started while the task prints catches
    up and then does the same; both end with the exit status on stderr.  ``lines``: how long
    the task prints (a tenth of a second each), so that a late follower slow to start on a
    busy machine still sees some printed live."""
    task_id = push(STAMPS.replace(f"seq 1 {LINES}", f"seq 1 {lines}"))
    early = start("logs", "-f", task_id)
    try:
        early.wait_err(f"waiting for task {task_id} to start...", 30)
        sup = worker()
        wait_for(lambda: len(early.out) >= 5, 60, what="the early follower's first lines")
        late = start("logs", "-f", task_id)
        try:
            # the late follower is following once it printed anything: lines printed from
            # then on are held to the bound, those before were caught up from the store
            wait_for(lambda: late.out, 30, what="the late follower's first line")
            late_since = late.out[0][0]
            # the task exits 4: logs -f exits 1, by the task's outcome (issue 25)
            assert early.wait(90) == 1, early.err
            assert late.wait(30) == 1, late.err
        finally:
            late.kill()
        for f in (early, late):
            stamps = f.text().splitlines()
            assert len(stamps) == lines and stamps == sorted(stamps), f.text()[-500:]
            assert f.err[-1] == "exit status 4", f.err
        lags = sorted(_lags(early))
        late_lags = sorted(_lags(late, late_since))
        print(f"print-to-follower lag: early follower median {lags[len(lags) // 2]:.2f}s max "
              f"{lags[-1]:.2f}s; late follower max {max(late_lags, default=0):.2f}s over "
              f"{len(late_lags)} lines")
        assert lags[-1] < BOUND, lags
        assert len(late_lags) >= 5, "the late follower saw too few live lines to judge"
        assert late_lags[-1] < BOUND, late_lags
        sup.signal(signal.SIGTERM)
        assert sup.wait(30) == 0
    finally:
        early.kill()
