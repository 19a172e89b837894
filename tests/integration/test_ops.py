"""Issue 5 §1, §2, §4: Scheduled Events preemption, sd_notify, the metrics file."""

from __future__ import annotations

import email.utils
import socket
import threading
import time

import pytest

from tests.conftest import wait_for
from tests.fakes.imds import FakeIMDS, preempt_event
from tests.integration.helpers import ready_count, term_times, write_recorder

pytestmark = pytest.mark.timeout(120)


def _rfc1123(seconds_from_now: float) -> str:
    return email.utils.formatdate(time.time() + seconds_from_now, usegmt=True)


def _polls_after(imds: FakeIMDS, count: int) -> None:
    """Wait for ``count`` more Scheduled Events polls than so far.  The poller reads one
    document at a time, so by the second of them it has handled what the first returned."""
    seen = len(imds.requests("GET"))
    wait_for(lambda: len(imds.requests("GET")) >= seen + count, 10,
             what=f"{count} more Scheduled Events polls")


@pytest.fixture
def imds():
    fake = FakeIMDS()
    yield fake
    fake.close()


def test_scheduled_preempt_requeues_and_cancel_resumes(env, imds):
    rec = write_recorder(env.tmp)
    f = env.tmp / "pre"
    [tid] = env.push(f"{rec} {f} 0")
    sup = env.supervisor("--scheduled-events", "on", "--scheduled-events-url", imds.url,
                         "--scheduled-events-interval", "0.2", "--scheduled-events-ack",
                         "--poll-interval", "0.2")
    wait_for(lambda: ready_count(f) == 1, 30, what="task running")
    imds.set_events([preempt_event("evt-1", resources=["some-other-vm"])])
    _polls_after(imds, 3)  # read it, acted on it (or not), polled twice more
    assert not term_times(f), "an event for another VM must not preempt us"
    t_event = time.time()
    imds.set_events([preempt_event("evt-1", not_before=_rfc1123(60))])
    wait_for(lambda: term_times(f), 10, what="SIGTERM after the Preempt event")
    assert term_times(f)[0] - t_event <= 2.0
    wait_for(lambda: env.job(tid)["status"] == "pending", 10, what="requeued")
    assert env.job(tid)["attempt"] == 0 and env.job(tid)["preemptions"] == 1
    # While the event stands no task starts, and the requeue is acknowledged.
    wait_for(lambda: imds.requests("POST"), 10, what="StartRequests acknowledgement")
    assert b'"EventId": "evt-1"' in imds.requests("POST")[0].body
    # Nothing is logged while receiving is held back: let the worker go on polling (5 polls
    # of 0.2 s, each as long as its receive interval) and check that no task started.
    _polls_after(imds, 5)
    assert env.job(tid)["status"] == "pending" and ready_count(f) == 1
    imds.set_events([])  # cancelled
    wait_for(lambda: ready_count(f) == 2, 20, what="receiving resumed")
    assert env.job(tid)["attempt"] == 1
    log = sup.log()
    assert "Scheduled Events: Preempt evt-1" in log and "cancelled" in log
    sup.signal(15)
    assert sup.wait(30) == 0


def test_scheduled_events_unreachable_never_stops_the_worker(env):
    with socket.socket() as s:  # a loopback port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}/metadata/scheduledevents?api-version=2020-07-01"
    env.push("sleep 1", "true")
    sup = env.supervisor("--scheduled-events", "on", "--scheduled-events-url", url,
                         "--scheduled-events-interval", "0.1", "--exit-when-empty")
    assert sup.wait(60) == 0
    warnings = [ln for ln in sup.log().splitlines() if "Scheduled Events" in ln and "WARN" in ln]
    assert 1 <= len(warnings) <= 2, warnings  # rate-limited
    assert "summary: succeeded=2" in sup.log()


def test_sd_notify_sequence(env):
    path = str(env.tmp / "notify.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.settimeout(0.2)
    messages: list[str] = []
    done = threading.Event()

    def read() -> None:  # like systemd: read as they come
        while not done.is_set():
            try:
                messages.append(sock.recv(4096).decode())
            except (socket.timeout, BlockingIOError):
                continue

    reader = threading.Thread(target=read)
    reader.start()
    try:
        env.push("sleep 2")
        sup = env.supervisor("--exit-when-empty", env={
            "NOTIFY_SOCKET": path, "WATCHDOG_USEC": "400000"})
        assert sup.wait(60) == 0
    finally:
        done.set()
        reader.join()
        # The supervisor has exited: whatever it sent is queued on the socket already.
        sock.setblocking(False)
        try:
            while True:
                messages.append(sock.recv(4096).decode())
        except BlockingIOError:
            pass
        sock.close()
    kinds = [m.split("=")[0] for m in messages]
    assert kinds[0] == "READY", messages
    assert kinds[-1] == "STOPPING", messages
    assert "WATCHDOG" in kinds and "STATUS" in kinds
    assert kinds.index("READY") < kinds.index("WATCHDOG") < kinds.index("STOPPING")
    assert any("running=1" in m for m in messages if m.startswith("STATUS="))
    assert kinds.count("WATCHDOG") >= 3  # pinged every 0.2 s during a 2 s task


def test_metrics_file(env):
    from prometheus_client.parser import text_string_to_metric_families

    metrics = env.tmp / "jobq.prom"
    env.push("true", "true", "exit 1", extra=("--max-attempts", "1"))
    sup = env.supervisor("--exit-when-empty", "--metrics-file", str(metrics),
                         "--metrics-interval", "0.2")
    assert sup.wait(60) == 4
    samples = {}
    for family in text_string_to_metric_families(metrics.read_text()):
        for s in family.samples:
            samples[s.name] = samples.get(s.name, 0) + s.value
    assert samples["jobq_tasks_started_total"] == 3
    assert samples["jobq_tasks_succeeded_total"] == 2
    assert samples["jobq_tasks_failed_total"] == 1
    assert samples["jobq_tasks_dead_lettered_total"] == 1
    assert samples["jobq_tasks_running"] == 0
    assert samples["jobq_supervisor_resident_memory_bytes"] > 1e6
    assert samples["jobq_last_successful_receive_timestamp_seconds"] > time.time() - 120


def test_metrics_file_unwritable_is_a_warning(env):
    env.push("true")
    sup = env.supervisor("--exit-when-empty", "--metrics-file", str(env.tmp / "no" / "m.prom"))
    assert sup.wait(60) == 0
    assert "metrics" in sup.log().lower()
