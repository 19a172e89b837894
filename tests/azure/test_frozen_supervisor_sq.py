"""Issue 13.1 on Storage Queue (Azurite): the supervisor SIGSTOPped (its pid only), its
lifeline kills the task before the message becomes visible again; a second supervisor then
runs it once, without overlap, and the frozen one, resumed, leaves the message alone."""

from __future__ import annotations

import signal
import threading
import time

import pytest

from tests.conftest import marked_processes, wait_for
from tests.integration.helpers import beating_task, death_time, long_sleeps, runs, stopped

# timing: times a frozen supervisor's lease deadline
pytestmark = [pytest.mark.timing, pytest.mark.azure, pytest.mark.timeout(120)]

FREEZE = 15.0


class VisibleWatch:
    """Peeks the queue every 20 ms from a thread (peeking does not hide a message).
    ``visible_at`` is when the last peek that still found it hidden was sent: the message
    became visible after that, so a death before it is a death before visibility."""

    def __init__(self, client) -> None:
        self.client = client
        self.visible_at: float | None = None
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        hidden_at = time.time()
        while not self.stop.wait(0.02):
            asked = time.time()
            if list(self.client.peek_messages(max_messages=1)):
                self.visible_at = hidden_at
                return
            hidden_at = asked


def test_frozen_supervisor_task_dies_before_message_is_visible(sq):
    log = sq.tmp / "runs"
    sq.ctl("push", "-c", beating_task(log))
    sup = sq.supervisor("--visibility-timeout", "6", "--renew-interval", "1", "-n", "1",
                        "--poll-interval", "0.2")
    wait_for(lambda: 1 in runs(log) and long_sleeps() == 2, 30,
             what=f"first run with its children\n{sup.log()}")
    procs = marked_processes()
    watch = VisibleWatch(sq.client())
    sup.signal(signal.SIGSTOP)
    stopped_at = time.time()
    wait_for(lambda: stopped(sup.pid), 5, what="supervisor stopped")
    other = None
    try:
        dead = death_time(procs, 12)
        assert dead is not None, f"task alive while its supervisor is frozen\n{sup.log()}"
        wait_for(lambda: watch.visible_at is not None, 12, what="message visible again")
        assert watch.visible_at is not None
        assert stopped(sup.pid), "the supervisor woke up: the test proves nothing"
        print(f"storage queue: task dead {watch.visible_at - dead:.2f}s before the message "
              f"was visible again ({watch.visible_at - stopped_at:.2f}s after the stop)")
        assert dead < watch.visible_at, f"task died {dead - watch.visible_at:.2f}s late"
        other = sq.supervisor("--visibility-timeout", "6", "--renew-interval", "1", "-n", "1",
                              "--poll-interval", "0.1")
        wait_for(lambda: 2 in runs(log), 30, what=f"the second run\n{other.log()}")
        assert runs(log)[1][-1][1] < runs(log)[2][0][1], "runs overlap"
        time.sleep(max(0.0, stopped_at + FREEZE - time.time()))
    finally:
        watch.stop.set()
        sup.signal(signal.SIGCONT)
    sup.wait_log("finished after lock loss")
    assert other is not None
    wait_for(lambda: runs(log)[2][-1][0] == "end", 30, what="second run done")
    wait_for(lambda: sq.count() == 0, 30, what="message deleted")
    for s in (sup, other):
        s.signal(signal.SIGTERM)
        assert s.wait(30) == 0, s.log()[-3000:]
    text = sup.log()
    assert "lease deadline passed with no word from the supervisor (frozen?): sent SIGKILL" \
        in text
    assert text.count("finished after lock loss") == 1
    # once, and no "sending ... to the task's process tree" the lifeline already killed
    assert text.count("lock lost") <= 1 and "to the task's process tree" not in text, text
    assert sorted(runs(log)) == [1, 2]
