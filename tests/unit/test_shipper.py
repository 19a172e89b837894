"""The output-store thread (supervisor/outstore/shipper.py) against a fake store whose calls
can be made to fail or block, with an injected clock: ``tick`` is driven by hand except where
the thread itself is under test (the stop budget, a blocked store)."""

from __future__ import annotations

import logging
import threading
import time

import pytest

from supervisor.fleet import shipper as mod
from supervisor.fleet.output.base import (
    DROPPED,
    DROPPED_FULL,
    RERUN,
    TRUNCATED,
    AttemptKey,
    OutputConfigError,
    OutputStoreError,
    OutputStoreFull,
)
from supervisor.fleet.shipper import OutputShipper
from tests.fakes.clock import FakeClock

pytestmark = pytest.mark.timeout(30)

K = AttemptKey("q", "t1", 1)
K2 = AttemptKey("q", "t2", 1)


class FakeStore:
    """Appends land in ``data``; ``fail`` makes calls raise, ``gate`` (cleared) blocks them.
    A failing append may store its bytes anyway (``store_then_fail``): a retry of the same
    bytes must then not store them twice, as the protocol promises."""

    name = "fake"

    def __init__(self) -> None:
        self.data: dict[AttemptKey, bytearray] = {}
        self.finished: list[AttemptKey] = []
        self.calls: list[tuple[str, AttemptKey, int]] = []
        self.fail = False
        self.error: type[OutputStoreError] = OutputStoreError  # what a failing append raises
        self.store_then_fail = False
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()
        self.purged: list[float] = []
        self._kept: dict[AttemptKey, bytes] = {}  # stored by a call that raised

    def append(self, key: AttemptKey, data: bytes) -> None:
        self.entered.set()
        self.gate.wait()
        self.calls.append(("append", key, len(data)))
        if self.fail and not self.store_then_fail:
            raise self.error("fake store down")
        if self._kept.pop(key, None) != data:  # the same bytes again: kept once (protocol)
            self.data.setdefault(key, bytearray()).extend(data)
        if self.fail:
            self._kept[key] = data
            raise OutputStoreError("fake store timed out after writing")

    def reopen(self, key: AttemptKey) -> int:
        self.entered.set()
        self.gate.wait()
        if self.fail and not self.store_then_fail:
            raise OutputStoreError("fake store down")
        self.calls.append(("reopen", key, 0))
        if key in self.finished:
            self.finished.remove(key)
        return len(self.data.get(key, b""))

    def finish(self, key: AttemptKey) -> None:
        self.gate.wait()
        if self.fail:
            raise OutputStoreError("fake store down")
        self.calls.append(("finish", key, 0))
        self.finished.append(key)

    def purge(self, before: float) -> int:
        if self.fail:
            raise OutputStoreError("fake store down")
        self.purged.append(before)
        return 0

    def close(self) -> None:
        pass


def make(store: FakeStore | None = None, *, buffer_limit: int = 10 << 20,
         output_max: int = 100 << 20, opener=None) -> tuple[OutputShipper, FakeStore, FakeClock]:
    store = store or FakeStore()
    clock = FakeClock(1000.0)
    sh = OutputShipper(opener or (lambda: store), buffer_limit=buffer_limit,
                       output_max=output_max, retention=3600.0, clock=clock,
                       wall=lambda: 50_000.0)
    return sh, store, clock


def stored(store: FakeStore, key: AttemptKey = K) -> bytes:
    return bytes(store.data.get(key, b""))


def test_output_is_written_within_a_second_and_the_thread_wakes_each_second():
    sh, store, clock = make()
    assert sh.tick() == pytest.approx(mod.FLUSH_EVERY)  # opens, nothing to write
    sh.feed(K, b"line 1\n")
    assert stored(store) == b""  # feed itself never calls the store
    clock.now += 0.4
    wait = sh.tick()
    assert stored(store) == b"" and wait == pytest.approx(0.6)
    clock.now += wait
    sh.tick()
    assert stored(store) == b"line 1\n"
    sh.feed(K, b"line 2\n")
    clock.now += mod.FLUSH_EVERY
    sh.tick()
    assert stored(store) == b"line 1\nline 2\n"
    assert sh.bytes_stored == 14 and sh.held() == 0


def test_a_big_buffer_is_written_at_once_in_chunks_of_at_most_4_mib():
    sh, store, clock = make(buffer_limit=64 << 20)
    sh.tick()
    sh.feed(K, b"a" * (mod.FLUSH_SIZE - 1))
    assert not sh._wake.is_set()
    sh.feed(K, b"b" * 10)
    assert sh._wake.is_set()  # crossing FLUSH_SIZE wakes the thread
    sh._wake.clear()
    sh.feed(K, b"c" * 10)
    assert not sh._wake.is_set()  # once per crossing, not per read
    sh.tick()  # not due by the clock, due by size
    assert len(stored(store)) == mod.FLUSH_SIZE + 19
    sh.feed(K, b"x" * (9 << 20))
    sh.tick()
    sizes = [n for what, _k, n in store.calls if what == "append"]
    assert sizes[1:] == [4 << 20, 4 << 20, 1 << 20]


def test_end_writes_the_rest_then_finishes_and_an_empty_attempt_leaves_nothing():
    sh, store, clock = make()
    sh.tick()
    sh.feed(K, b"last words")
    sh.end(K)
    sh.end(K2)  # printed nothing: not stored at all (its result record tells its end)
    sh.tick()  # not due by the clock: an ended attempt is written at any wake-up
    assert stored(store) == b"last words"
    assert store.finished == [K]
    assert store.calls.index(("finish", K, 0)) > store.calls.index(("append", K, 10))
    assert K2 not in store.data
    assert sh._attempts == {}


def test_a_failed_write_is_retried_with_the_same_bytes_and_not_duplicated(caplog):
    caplog.set_level(logging.INFO, logger="jobq")
    sh, store, clock = make()
    sh.tick()
    sh.feed(K, b"one\n")
    store.fail = store.store_then_fail = True  # stored, but the call raised (a timeout)
    clock.now += 1
    wait = sh.tick()
    assert wait == pytest.approx(mod.BACKOFF_MIN)
    sh.feed(K, b"two\n")
    store.fail = store.store_then_fail = False
    clock.now += wait
    sh.tick()  # the chunk in flight again, exactly
    clock.now += 1
    sh.tick()
    assert stored(store) == b"one\ntwo\n"
    appends = [n for what, _k, n in store.calls if what == "append"]
    assert appends == [4, 4, 4]
    assert sum("output store unavailable" in r.message for r in caplog.records) == 1
    assert sum("reachable again" in r.message for r in caplog.records) == 1


def test_back_off_doubles_to_30s_and_the_outage_is_logged_once(caplog):
    sh, store, clock = make()
    sh.tick()
    store.fail = True
    waits = []
    for _ in range(8):
        sh.feed(K, b"x\n")
        clock.now += mod.FLUSH_EVERY
        w = sh.tick()
        waits.append(w)
        clock.now += w
    assert waits[:6] == [1.0, 2.0, 4.0, 8.0, 16.0, 30.0]
    assert waits[6:] == [30.0, 30.0]
    assert sum("output store unavailable" in r.message for r in caplog.records) == 1


def test_beyond_the_buffer_output_is_dropped_and_marked_at_the_gap():
    sh, store, clock = make(buffer_limit=100)
    sh.tick()
    store.fail = True
    sh.feed(K, b"A" * 60)
    clock.now += 1
    clock.now += sh.tick()  # fails: 60 held in flight
    sh.feed(K, b"B" * 30)  # 90 held
    sh.feed(K, b"C" * 20)  # would be 110: dropped
    sh.feed(K, b"D" * 5)  # would fit, but dropping goes on until half the bound is free
    sh.feed(K2, b"E" * 5)  # for every attempt
    assert sh.bytes_dropped == 30 and sh.held() == 90
    store.fail = False
    sh.tick()
    assert sh.held() == 0
    sh.feed(K, b"F" * 10)  # room again: the marker first, then the read
    sh.end(K2)  # a gap at the end is marked too, and stored though nothing else was
    clock.now += 1
    sh.tick()
    assert stored(store) == (b"A" * 60 + b"B" * 30 + DROPPED.format(n=25).encode()
                             + b"F" * 10)
    assert stored(store, K2) == DROPPED.format(n=5).encode()
    assert store.finished == [K2]


def test_a_gap_while_the_store_is_full_is_marked_so_and_logged_once_stored(caplog):
    sh, store, clock = make(buffer_limit=100)
    sh.feed(K, b"0")
    sh.tick()  # stored: the attempt is open in the store
    store.fail, store.error = True, OutputStoreFull
    sh.feed(K, b"A" * 60)
    clock.now += 1
    clock.now += sh.tick()  # no room: 60 held in flight
    sh.feed(K, b"B" * 50)  # dropped
    store.fail = False
    with caplog.at_level(logging.WARNING, logger="jobq.output"):
        sh.tick()  # the held bytes stored; the marker waits for the next read
        assert not [r for r in caplog.records if "were dropped" in r.message]
        sh.feed(K, b"C" * 10)
        clock.now += 1
        sh.tick()
    assert stored(store) == b"0" + b"A" * 60 + DROPPED_FULL.format(n=50).encode() + b"C" * 10
    assert [r.message for r in caplog.records if "were dropped" in r.message] == [
        "[t1] output store: 50 byte(s) of attempt 1's output were dropped while the store "
        "was full; its stored output has a marker in their place"]


def test_a_gap_at_the_end_is_marked_by_end():
    sh, store, clock = make(buffer_limit=10)
    sh.tick()
    sh.feed(K, b"0123456789")
    sh.feed(K, b"lost")
    sh.end(K)
    sh.tick()
    assert stored(store) == b"0123456789" + DROPPED.format(n=4).encode()
    assert store.finished == [K]


def test_the_cap_stores_max_bytes_then_one_truncation_marker():
    sh, store, clock = make(output_max=25)
    sh.tick()
    sh.feed(K, b"x" * 20)
    sh.feed(K, b"y" * 10)  # 5 fit
    sh.feed(K, b"z" * 100)
    sh.end(K)
    sh.tick()
    marker = TRUNCATED.format(limit=25).encode()
    assert stored(store) == b"x" * 20 + b"y" * 5 + marker
    assert sh.bytes_truncated == 105
    assert store.finished == [K]


def test_no_store_for_this_queue_turns_the_shipper_off():
    sh, store, clock = make(opener=lambda: None)
    sh.feed(K, b"held until the store is known\n")
    sh.tick()
    assert sh.disabled and sh.held() == 0
    sh.feed(K, b"ignored")
    assert sh.held() == 0


def test_a_store_that_cannot_work_is_logged_once_and_output_is_not_held(caplog):
    def opener():
        raise OutputConfigError("not authorized")

    sh, store, clock = make(opener=opener)
    sh.tick()
    assert sh.disabled
    assert [r.levelname for r in caplog.records if "not authorized" in r.message] == ["ERROR"]


def _opens_on_third_try(store):
    """An opener that fails twice ("no route"), then opens ``store``; and its tries."""
    tries = []

    def opener():
        tries.append(1)
        if len(tries) < 3:
            raise OutputStoreError("no route")
        return store

    return opener, tries


def test_an_open_failure_is_retried_with_back_off():
    store = FakeStore()
    opener, tries = _opens_on_third_try(store)
    sh, _s, clock = make(opener=opener)
    sh.feed(K, b"early\n")
    assert sh.tick() == 1.0
    clock.now += 1.0
    assert sh.tick() == 2.0
    clock.now += 2.0
    sh.tick()
    assert stored(store) == b"early\n" and len(tries) == 3


def test_retention_is_purged_soon_after_opening_then_hourly():
    sh, store, clock = make()
    sh.tick()
    assert store.purged == []
    clock.now += mod.PURGE_FIRST
    sh.tick()
    assert store.purged == [50_000.0 - 3600.0]
    clock.now += mod.PURGE_EVERY - 1
    sh.tick()
    assert len(store.purged) == 1
    clock.now += 1
    sh.tick()
    assert len(store.purged) == 2


@pytest.mark.timing  # asserts a 0.5 s bound
def test_feed_and_end_never_wait_for_a_blocked_store():
    store = FakeStore()
    store.gate.clear()
    sh = OutputShipper(lambda: store, buffer_limit=1 << 20, output_max=1 << 30,
                       retention=60.0)
    sh.start()
    try:
        sh.feed(K, b"y" * (1 << 20))  # the whole buffer, and FLUSH_SIZE: written at once
        sh.feed(K, b"x" * (2 << 20))  # dropped
        assert store.entered.wait(10), "the thread never called the store"
        t0 = time.monotonic()
        for _ in range(1000):
            sh.feed(K, b"z" * 1000)
        sh.end(K)
        assert time.monotonic() - t0 < 0.5
    finally:
        store.gate.set()
        sh.stop(budget=5.0)


def test_stop_flushes_what_is_held_and_finishes():
    store = FakeStore()
    sh = OutputShipper(lambda: store, buffer_limit=1 << 20, output_max=1 << 30,
                       retention=60.0)
    sh.start()
    sh.feed(K, b"tail")
    sh.end(K)
    sh.feed(K2, b"still running")
    sh.stop()
    assert stored(store) == b"tail" and stored(store, K2) == b"still running"
    assert K in store.finished


def test_the_store_opens_after_the_delay_or_at_once_when_output_piles_up(monkeypatch):
    # Opening imports the store's SDK; at start that competed with the first task's start.
    monkeypatch.setattr(mod, "OPEN_DELAY", 30.0)
    store = FakeStore()
    opened = threading.Event()

    def opener() -> FakeStore:
        opened.set()
        return store

    sh = OutputShipper(opener, buffer_limit=8 << 20, output_max=1 << 30, retention=60.0)
    sh.start()
    try:
        assert not opened.wait(0.3)  # a 30 s delay: not opened yet
        sh.feed(K, b"x" * mod.FLUSH_SIZE)  # a full buffer wakes the thread
        assert opened.wait(10)
    finally:
        sh.stop()
    assert len(stored(store)) == mod.FLUSH_SIZE


@pytest.mark.timing  # asserts a 2 s bound
def test_a_black_holed_store_holds_up_stop_only_for_the_budget(caplog):
    store = FakeStore()
    sh = OutputShipper(lambda: store, buffer_limit=1 << 20, output_max=1 << 30,
                       retention=60.0)
    sh.start()
    try:
        sh.feed(K, b"first")
        sh.end(K)
        wait_until(lambda: K in store.finished)
        store.gate.clear()  # every call hangs from now on
        sh.feed(K2, b"x" * 1000)
        t0 = time.monotonic()
        sh.stop(budget=0.5)
        took = time.monotonic() - t0
        assert took < 2.0
        assert any("1000 byte(s) of task output not stored" in r.message
                   for r in caplog.records)
    finally:
        store.gate.set()


def wait_until(cond, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        threading.Event().wait(0.01)


def test_each_run_reopens_once_and_a_rerun_after_earlier_output_is_marked():
    """An attempt released without counting runs again under the same key: its output is
    reopened before its first write (once per run, not per write) and starts with RERUN."""
    sh, store, clock = make()
    sh.tick()
    sh.feed(K, b"first run\n")
    clock.now += 1
    sh.tick()
    sh.feed(K, b"more\n")
    sh.end(K)
    sh.tick()
    assert [c[0] for c in store.calls] == ["reopen", "append", "append", "finish"]
    assert store.finished == [K]
    store.calls.clear()
    sh.feed(K, b"second run\n")  # the same key again, later (here or on another worker)
    sh.end(K)
    sh.tick()
    assert [c[0] for c in store.calls] == ["reopen", "append", "finish"]
    mark = RERUN.format(attempt=1).encode()
    assert stored(store) == b"first run\nmore\n" + mark + b"second run\n"
    assert mark.strip() == b"[... attempt 1 runs again: requeued ...]"
    assert sh._attempts == {} and sh._closing == [] and sh.held() == 0


def test_a_rerun_that_starts_before_the_last_runs_end_is_stored_waits_for_it():
    sh, store, clock = make()
    sh.tick()
    store.fail = True
    one = b"1" * (mod.CHUNK_MAX + 10)  # two writes: the next run's bytes must not go between
    sh.feed(K, one)
    sh.end(K)
    clock.now += 1
    sh.tick()  # the store is down: the first run is still held
    sh.feed(K, b"two\n")  # the next run of the same key, on this worker
    sh.end(K)
    store.fail = False
    clock.now += 60
    sh.tick()
    assert stored(store) == one + RERUN.format(attempt=1).encode() + b"two\n"
    assert [c[0] for c in store.calls] == ["reopen", "append", "append", "finish",
                                           "reopen", "append", "finish"]
    assert sh._attempts == {} and sh._closing == [] and sh.held() == 0


def test_a_failed_reopen_is_retried_and_the_marker_written_once():
    sh, store, clock = make()
    store.data[K] = bytearray(b"earlier\n")  # a run on another worker
    store.finished.append(K)
    sh.tick()
    sh.feed(K, b"again\n")
    store.fail = True
    clock.now += 1
    wait = sh.tick()
    assert ("reopen", K, 0) not in store.calls  # it raised
    store.store_then_fail = True  # reopens, then the append stores and times out
    clock.now += wait
    wait = sh.tick()
    assert [c[0] for c in store.calls] == ["reopen", "append"]
    store.fail = store.store_then_fail = False
    clock.now += wait
    sh.end(K)
    sh.tick()
    assert stored(store) == b"earlier\n" + RERUN.format(attempt=1).encode() + b"again\n"
    assert store.finished == [K]


def test_an_open_or_a_pass_without_a_store_call_is_no_recovery(caplog):
    """Issue 26: only a store call that answered ends an outage.  Opening (an SDK client is
    built lazily, no call) and a pass with nothing to write prove nothing: no "reachable
    again" line and no reset of the back-off until a write goes through."""
    caplog.set_level(logging.INFO, logger="jobq")
    store = FakeStore()
    opener, tries = _opens_on_third_try(store)
    sh, _s, clock = make(opener=opener)
    assert sh.tick() == 1.0
    clock.now += 1.0
    assert sh.tick() == 2.0
    clock.now += 2.0
    sh.tick()  # opens: no call made, nothing to write
    assert sh.store is store and store.calls == []
    assert not [r for r in caplog.records if "reachable again" in r.message]
    assert sh._outage.failures == 2 and sh._outage.backoff == 2.0
    sh.feed(K, b"now\n")
    clock.now += mod.FLUSH_EVERY
    sh.tick()  # the first call that answered
    assert stored(store) == b"now\n"
    assert [r.message for r in caplog.records if "reachable again" in r.message] == [
        "output store reachable again after 2 failed call(s)"]
