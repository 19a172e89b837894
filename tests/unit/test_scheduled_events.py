"""Scheduled Events poller against FakeIMDS, a real HTTP server on 127.0.0.1.

Nothing here may reach the real metadata address: every URL is the fake's loopback one, and an
autouse guard fails any connection to another host.
"""

from __future__ import annotations

import calendar
import json
import logging
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Callable

import pytest

from supervisor.worker.preemption import (
    AZURE_ASSET_TAG,
    SCHEDULED_EVENTS_URL,
    PreemptEvent,
    ScheduledEventsPoller,
    imds_base,
    is_azure_vm,
    local_vm_names,
    parse_not_before,
    scheduled_events_enabled,
)
from tests.conftest import wait_for
from tests.fakes.imds import FakeIMDS, preempt_event

pytestmark = pytest.mark.timeout(30)

INTERVAL = 0.1
NOT_BEFORE = "Mon, 19 Sep 2016 18:29:47 GMT"
NOT_BEFORE_EPOCH = calendar.timegm((2016, 9, 19, 18, 29, 47))
THIS_VM, OTHER_VM = "this-vm", "other-vm"


@pytest.fixture(autouse=True)
def loopback_only(monkeypatch) -> None:
    real = socket.create_connection

    def guarded(address: Any, *args: Any, **kwargs: Any) -> socket.socket:
        assert address[0] == "127.0.0.1", f"test tried to connect to {address!r}"
        return real(address, *args, **kwargs)

    monkeypatch.setattr(socket, "create_connection", guarded)


@pytest.fixture(autouse=True)
def no_threads_left() -> Iterator[None]:
    before = set(threading.enumerate())
    yield
    wait_for(lambda: not (set(threading.enumerate()) - before), 5, 0.01,
             "the test's threads to end")


@pytest.fixture
def fake_imds() -> Iterator[FakeIMDS]:
    with FakeIMDS() as imds:
        yield imds


@pytest.fixture
def dead_url() -> str:
    """A loopback URL where nothing listens (connection refused)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/metadata/scheduledevents?api-version=2020-07-01"


class Changes:
    """on_change recorder: (monotonic time, event) per call."""

    def __init__(self) -> None:
        self.calls: list[tuple[float, PreemptEvent | None]] = []
        self._cond = threading.Condition()

    def __call__(self, event: PreemptEvent | None) -> None:
        with self._cond:
            self.calls.append((time.monotonic(), event))
            self._cond.notify_all()

    def events(self) -> list[PreemptEvent | None]:
        with self._cond:
            return [e for _, e in self.calls]

    def wait(self, n: int, timeout: float = 5.0) -> list[PreemptEvent | None]:
        with self._cond:
            assert self._cond.wait_for(lambda: len(self.calls) >= n, timeout), \
                f"expected {n} on_change call(s), got {self.calls}"
            return [e for _, e in self.calls]


StartPoller = Callable[..., "tuple[ScheduledEventsPoller, Changes]"]


@pytest.fixture
def start_poller(fake_imds: FakeIMDS) -> Iterator[StartPoller]:
    """Start pollers (default: the fake's URL); every one is stopped and joined at teardown,
    before the fake closes."""
    pollers: list[ScheduledEventsPoller] = []

    def start(url: str | None = None, *, vm_names=(THIS_VM,), interval: float = INTERVAL,
              timeout: float = 2.0, on_change=None) -> tuple[ScheduledEventsPoller, Changes]:
        changes = Changes()
        poller = ScheduledEventsPoller(url or fake_imds.url, interval=interval,
                                       on_change=on_change or changes, vm_names=vm_names,
                                       timeout=timeout)
        pollers.append(poller)
        poller.start()
        return poller, changes

    yield start
    for poller in pollers:
        assert poller.stop(5.0), "poller thread did not stop"


def polls(imds: FakeIMDS, n: int, timeout: float = 5.0) -> None:
    """Wait until the fake has answered ``n`` more GETs than now."""
    target = len(imds.requests("GET")) + n
    wait_for(lambda: len(imds.requests("GET")) >= target, timeout, 0.01,
             f"{n} more polls")


# -- the poller ----------------------------------------------------------------------------
def test_no_event_no_callback(fake_imds: FakeIMDS, start_poller) -> None:
    fake_imds.set_events([preempt_event("reboot", "Reboot", [THIS_VM]),
                          preempt_event("freeze", "Freeze", [])])
    poller, changes = start_poller()
    polls(fake_imds, 4)
    assert changes.events() == []
    assert poller.current is None and poller.failures == 0


@pytest.mark.parametrize("event_type, resources", [
    ("Preempt", [THIS_VM]),
    ("Preempt", []),  # no Resources: the whole deployment
    ("Terminate", ["someone-else", THIS_VM.upper()]),  # hostnames are case-insensitive
])
def test_event_for_this_vm_is_reported_within_two_intervals(
        fake_imds: FakeIMDS, start_poller, event_type, resources) -> None:
    poller, changes = start_poller()
    polls(fake_imds, 1)
    t0 = time.monotonic()
    fake_imds.set_events([preempt_event("reboot", "Reboot", [THIS_VM]),
                          preempt_event("evt-1", event_type, resources, NOT_BEFORE)])
    [event] = changes.wait(1)
    # ~2 intervals plus slack for a loaded machine.
    assert changes.calls[0][0] - t0 < 2 * INTERVAL + 0.4
    assert event == PreemptEvent("evt-1", event_type, float(NOT_BEFORE_EPOCH))
    assert poller.current == event
    polls(fake_imds, 3)
    assert len(changes.events()) == 1  # only transitions


def test_event_for_another_vm_only_is_ignored(fake_imds: FakeIMDS, start_poller) -> None:
    fake_imds.set_events([preempt_event("evt-1", "Preempt", [OTHER_VM]),
                          preempt_event("evt-2", "Terminate", [OTHER_VM, "third-vm"])])
    poller, changes = start_poller()
    polls(fake_imds, 4)
    assert changes.events() == []
    assert poller.failures == 0


def test_first_relevant_event_wins_and_is_picked_past_others(fake_imds: FakeIMDS,
                                                             start_poller) -> None:
    fake_imds.set_events([preempt_event("other", "Preempt", [OTHER_VM]),
                          preempt_event("mine", "Preempt", [THIS_VM]),
                          preempt_event("later", "Terminate", [THIS_VM])])
    _, changes = start_poller()
    [event] = changes.wait(1)
    assert event is not None and event.event_id == "mine"


def test_cancel_and_change_of_id_are_transitions(fake_imds: FakeIMDS, start_poller) -> None:
    fake_imds.set_events([preempt_event("evt-1", "Preempt", [THIS_VM])])
    poller, changes = start_poller()
    changes.wait(1)
    fake_imds.set_events([])  # Azure cancelled it
    assert changes.wait(2)[1] is None
    assert poller.current is None
    fake_imds.set_events([preempt_event("evt-2", "Preempt", [THIS_VM], "")])
    third = changes.wait(3)[2]
    assert third == PreemptEvent("evt-2", "Preempt", None)
    fake_imds.set_events([preempt_event("evt-3", "Terminate", [])])
    fourth = changes.wait(4)[3]
    assert fourth is not None and fourth.event_id == "evt-3"
    polls(fake_imds, 3)
    assert len(changes.events()) == 4


def test_metadata_header_on_every_request(fake_imds: FakeIMDS, start_poller) -> None:
    start_poller()
    polls(fake_imds, 3)
    gets = fake_imds.requests("GET")
    assert gets and all(r.headers.get("metadata") == "true" for r in gets)
    assert all(r.path == "/metadata/scheduledevents?api-version=2020-07-01" for r in gets)


def test_a_request_without_the_header_is_refused_by_the_fake(fake_imds: FakeIMDS) -> None:
    import urllib.error
    import urllib.request

    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with pytest.raises(urllib.error.HTTPError) as info:
        opener.open(fake_imds.url, timeout=2)
    assert info.value.code == 400
    info.value.close()


@pytest.mark.parametrize("mode", ["500", "garbage", "hang"])
def test_broken_endpoint_keeps_polling_and_recovers(fake_imds: FakeIMDS, start_poller,
                                                    mode, caplog) -> None:
    fake_imds.set_broken(mode)
    fake_imds.set_events([preempt_event("evt-1", "Preempt", [THIS_VM])])
    with caplog.at_level(logging.DEBUG, logger="jobq.preemption"):
        poller, changes = start_poller(timeout=0.3)
        wait_for(lambda: poller.failures >= 3, 10, 0.01, "three failed polls")
        assert poller.is_alive()
        assert changes.events() == []
        fake_imds.set_broken(None)
        [event] = changes.wait(1)
    assert event is not None and event.event_id == "evt-1"
    assert poller.failures == 0
    messages = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert sum(level == "WARNING" and "failed" in text for level, text in messages) == 1
    assert any(level == "INFO" and "answers again" in text for level, text in messages)


def test_unreachable_endpoint_does_not_stop_the_thread(dead_url: str, start_poller) -> None:
    poller, changes = start_poller(dead_url)
    wait_for(lambda: poller.failures >= 3, 10, 0.01, "three failed polls")
    assert poller.is_alive() and changes.events() == []


def test_failure_warning_is_rate_limited(fake_imds: FakeIMDS, start_poller, caplog) -> None:
    fake_imds.set_broken("500")
    with caplog.at_level(logging.WARNING, logger="jobq.preemption"):
        poller, _ = start_poller(interval=0.01)
        wait_for(lambda: poller.failures >= 20, 10, 0.01, "20 failed polls")
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    assert "HTTP Error 500" in warnings[0].getMessage()


def test_failure_warning_repeats_after_a_minute(fake_imds: FakeIMDS, caplog) -> None:
    fake_imds.set_broken("garbage")
    poller = ScheduledEventsPoller(fake_imds.url, interval=1, on_change=Changes(),
                                   vm_names={THIS_VM})
    now = [100.0]
    poller.clock = lambda: now[0]
    with caplog.at_level(logging.WARNING, logger="jobq.preemption"):
        for step in (0.0, 30.0, 29.0, 1.0, 1.0):
            now[0] += step
            poller.poll_once()
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 2
    assert "3 more failure(s)" not in warnings[1] and "2 more failure(s)" in warnings[1]


def test_callback_error_does_not_stop_the_thread(fake_imds: FakeIMDS, start_poller,
                                                 caplog) -> None:
    seen = Changes()

    def explode(event: PreemptEvent | None) -> None:
        seen(event)
        raise RuntimeError("bug in the worker")

    fake_imds.set_events([preempt_event("evt-1", "Preempt", [THIS_VM])])
    poller, _ = start_poller(on_change=explode)
    seen.wait(1)
    fake_imds.set_events([])
    assert seen.wait(2)[1] is None
    assert poller.is_alive()
    assert any("on_change" in r.getMessage() for r in caplog.records)


@pytest.mark.timing  # asserts a wall-clock bound
@pytest.mark.timeout(10)
def test_stop_joins_promptly_while_a_request_hangs(fake_imds: FakeIMDS, start_poller) -> None:
    fake_imds.set_broken("hang")
    poller, _ = start_poller()  # the default 2 s request timeout
    wait_for(lambda: fake_imds.requests("GET"), 5, 0.01, "a request in flight")
    t0 = time.monotonic()
    assert poller.stop()
    assert time.monotonic() - t0 <= 3.0
    assert not poller.is_alive()


@pytest.mark.timing  # asserts a 1 s bound
def test_stop_while_idle_is_immediate(fake_imds: FakeIMDS, start_poller) -> None:
    poller, _ = start_poller(interval=30.0)
    wait_for(lambda: fake_imds.requests("GET"), 5, 0.01, "the first poll")
    t0 = time.monotonic()
    assert poller.stop()
    assert time.monotonic() - t0 < 1.0


# -- acknowledge -----------------------------------------------------------------------------
def test_acknowledge_posts_start_requests(fake_imds: FakeIMDS) -> None:
    poller = ScheduledEventsPoller(fake_imds.url, interval=INTERVAL, on_change=Changes(),
                                   vm_names={THIS_VM})
    assert poller.acknowledge("evt-1") is True
    [post] = fake_imds.requests("POST")
    assert json.loads(post.body) == {"StartRequests": [{"EventId": "evt-1"}]}
    assert post.headers["metadata"] == "true"
    assert post.headers["content-type"] == "application/json"
    assert post.path == "/metadata/scheduledevents?api-version=2020-07-01"


@pytest.mark.parametrize("mode", ["500", "hang"])
def test_acknowledge_failure_returns_false(fake_imds: FakeIMDS, mode) -> None:
    fake_imds.set_broken(mode)
    poller = ScheduledEventsPoller(fake_imds.url, interval=INTERVAL, on_change=Changes(),
                                   vm_names={THIS_VM}, timeout=0.3)
    assert poller.acknowledge("evt-1") is False


def test_acknowledge_unreachable_returns_false(dead_url: str) -> None:
    poller = ScheduledEventsPoller(dead_url, interval=INTERVAL, on_change=Changes(),
                                   vm_names={THIS_VM})
    assert poller.acknowledge("evt-1") is False


# -- names, detection, parsing ---------------------------------------------------------------
def test_local_vm_names(fake_imds: FakeIMDS, dead_url: str) -> None:
    host = socket.gethostname()
    assert host in local_vm_names(None)
    assert fake_imds.requests() == []
    names = local_vm_names(fake_imds.base)
    assert {host, "fake-vm"} <= names
    [req] = fake_imds.requests()
    assert req.path == "/metadata/instance/compute/name?api-version=2021-02-01&format=text"
    assert req.headers["metadata"] == "true"
    assert local_vm_names(imds_base(dead_url)) == local_vm_names(None)
    fake_imds.set_broken("500")
    assert "fake-vm" not in local_vm_names(fake_imds.base + "/")


def test_imds_base() -> None:
    assert imds_base(SCHEDULED_EVENTS_URL) == "http://169.254.169.254"
    assert imds_base("http://127.0.0.1:8080/metadata/scheduledevents?x=1") == \
        "http://127.0.0.1:8080"


def dmi(tmp_path: Path, **files: str) -> str:
    for name, text in files.items():
        (tmp_path / name).write_text(text + "\n")
    return str(tmp_path)


def test_is_azure_vm_by_asset_tag(tmp_path: Path) -> None:
    assert is_azure_vm(dmi(tmp_path, chassis_asset_tag=AZURE_ASSET_TAG))


def test_is_azure_vm_by_vendor_and_product(tmp_path: Path) -> None:
    assert is_azure_vm(dmi(tmp_path, chassis_asset_tag="", sys_vendor="Microsoft Corporation",
                           product_name="Virtual Machine"))


@pytest.mark.parametrize("files", [
    {},  # nothing readable
    {"chassis_asset_tag": "No Asset Tag", "sys_vendor": "QEMU",
     "product_name": "Standard PC (i440FX + PIIX, 1996)"},
    {"sys_vendor": "Microsoft Corporation", "product_name": "Surface Laptop"},
    {"sys_vendor": "Amazon EC2", "product_name": "Virtual Machine"},
])
def test_is_not_azure_vm(tmp_path: Path, files: dict[str, str]) -> None:
    assert not is_azure_vm(dmi(tmp_path, **files))


def test_unreadable_dmi_file_is_not_azure(tmp_path: Path) -> None:
    (tmp_path / "chassis_asset_tag").mkdir()  # reading a directory fails with OSError
    assert not is_azure_vm(str(tmp_path))
    assert not is_azure_vm(str(tmp_path / "missing"))


def test_scheduled_events_enabled(tmp_path: Path) -> None:
    (tmp_path / "azure").mkdir()
    (tmp_path / "plain").mkdir()
    azure = dmi(tmp_path / "azure", chassis_asset_tag=AZURE_ASSET_TAG)
    plain = str(tmp_path / "plain")
    assert scheduled_events_enabled("on", {}, plain)
    assert not scheduled_events_enabled("off", {}, azure)
    assert scheduled_events_enabled("auto", {}, azure)
    assert scheduled_events_enabled("auto", {"JOBQ_DISABLE_SCHEDULED_EVENTS": "0"}, azure)
    assert not scheduled_events_enabled("auto", {"JOBQ_DISABLE_SCHEDULED_EVENTS": "1"}, azure)
    assert not scheduled_events_enabled("auto", {}, plain)
    assert scheduled_events_enabled("on", {"JOBQ_DISABLE_SCHEDULED_EVENTS": "1"}, plain)
    with pytest.raises(ValueError, match="on, off or auto"):
        scheduled_events_enabled("maybe", {}, plain)


@pytest.mark.parametrize("text, expected", [
    (NOT_BEFORE, float(NOT_BEFORE_EPOCH)),
    ("Mon, 19 Sep 2016 18:29:47 -0000", float(NOT_BEFORE_EPOCH)),
    ("", None),
    ("   ", None),
    ("next Tuesday", None),
])
def test_parse_not_before(text: str, expected: float | None) -> None:
    assert parse_not_before(text) == expected


def test_seconds_left() -> None:
    event = PreemptEvent("e", "Preempt", 1000.0)
    assert event.seconds_left(970.0) == 30.0
    assert event.seconds_left(1005.0) == 0.0
    assert PreemptEvent("e", "Preempt", None).seconds_left(970.0) is None


@pytest.mark.parametrize("doc", [
    [], {"Events": "no"}, {"Events": [42]}, {"DocumentIncarnation": 1},
    {"Events": [{"EventType": "Preempt", "Resources": []}]},  # no EventId
    {"Events": [{"EventId": "x", "EventType": "Preempt", "Resources": "this-vm"}]},
])
def test_malformed_documents_are_errors(doc: Any) -> None:
    poller = ScheduledEventsPoller("http://127.0.0.1:9/", interval=1, on_change=Changes(),
                                   vm_names={THIS_VM})
    with pytest.raises(ValueError):
        poller.relevant(doc)
