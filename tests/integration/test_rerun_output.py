"""An attempt released without counting (the worker stopped by SIGTERM) runs again under the
same attempt number on a second worker: its stored output shows both runs with the RERUN
marker between them, and ``jobq-ctl logs -f`` started during the first run follows the second
to its end (real supervisors and jobq-ctl on a SQLite queue; output files beside it)."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from supervisor.fleet.output.base import RERUN, AttemptKey
from supervisor.fleet.output.files import FileOutputStore, output_dir
from tests.conftest import Env, command, wait_for
from tests.integration.captured import Captured

pytestmark = pytest.mark.timeout(120)


def Follow(env: Env, task_id: str) -> Captured:  # noqa: N802
    """``jobq-ctl logs -f``, its stdout and stderr collected by reader threads."""
    return Captured.start([*command("jobq-ctl"), "--sqlite-path", str(env.db), "logs", "-f",
                           task_id], cwd=env.tmp)


def test_a_requeued_attempt_runs_again_with_a_marker_and_logs_f_follows_it_to_the_end(
        env: Env, tmp_path: Path) -> None:
    ran, ended = tmp_path / "ran", tmp_path / "ended"
    # First run: two lines, then wait to be stopped.  Second run: two lines 4 s apart, exit 0.
    (tid,) = env.push(
        f"if [ -e {ran} ]; then echo second-a; sleep 4; echo second-b; "
        f"date +%s.%N > {ended}.tmp; mv {ended}.tmp {ended}; exit 0; fi; "
        f"touch {ran}; echo first-a; echo first-b; sleep 60")
    store = FileOutputStore(output_dir(str(env.db)))
    key = AttemptKey("default", tid, 1)

    def stored() -> bytes:
        return store.read(key).data

    sup1 = env.supervisor()
    wait_for(lambda: b"first-b" in stored(), 30, what="the first run's output in the store")
    follow = Follow(env, tid)
    try:
        wait_for(lambda: b"first-b" in follow.stdout(), 30, what=f"logs -f output ({follow.err})")
        sup1.signal(signal.SIGTERM)
        assert sup1.wait(30) == 0
        assert "back to the queue, attempt not counted" in sup1.log()
        assert store.read(key).complete  # the first run's output was completed
        wait_for(lambda: "requeued" in follow.err, 30, what=f"'requeued' ({follow.err})")
        assert follow.proc.poll() is None, "logs -f ended at the requeue"

        sup2 = env.supervisor("--exit-when-empty")
        wait_for(lambda: b"second-a" in follow.stdout(), 30, what=f"the rerun ({follow.err})")
        complete, over = store.read(key).complete, ended.exists()
        assert over or not complete  # reopened: not complete while it runs again
        assert follow.proc.poll() is None
        assert sup2.wait(60) == 0
        assert follow.wait(60) == 0
    finally:
        follow.kill()
    # logs -f ended (its last line) only after the rerun ended
    assert float(ended.read_text()) < follow.err_at[-1]
    mark = RERUN.format(attempt=1).encode()
    both = b"first-a\nfirst-b\n" + mark + b"second-a\nsecond-b\n"
    assert follow.stdout() == both
    assert follow.err == ["requeued", "== attempt 1 runs again ==", "exit status 0"]
    assert store.read(key).complete and store.read(key).data == both
    logs = env.ctl("logs", tid)
    assert logs.stdout == both.decode()
    job = env.job(tid)
    assert (job["status"], job["attempt"]) == ("succeeded", 1)  # the requeue did not count
