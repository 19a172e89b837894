"""The depth sampler and its charts, on an injected clock and a fake data source (no
threads, no sleeps); the history kept in a real control store and read back by a new
dashboard app (Flask test client)."""

from __future__ import annotations

import time

import pytest

from supervisor.dashboard.app import create_app
from supervisor.dashboard.charts import depth_chart, finished_chart
from supervisor.dashboard.data import Unavailable
from supervisor.dashboard.history import History, Sample, Sampler
from supervisor.fleet.control.records import HistoryPoint
from tests.dashboard.conftest import data_source

pytestmark = pytest.mark.timeout(30)


class FakeData:
    def __init__(self, queue: str = "default") -> None:
        self.queue = queue
        self.counts_seq: list[dict[str, int] | Exception] = []
        self.workers_seq: list[list[dict] | Exception] = []
        self.closed = 0
        self.kept: list[HistoryPoint] = []
        self.keep_errors: list[Exception] = []

    def put_history(self, point: HistoryPoint) -> None:
        if self.keep_errors:
            raise self.keep_errors.pop(0)
        self.kept.append(point)

    def workers(self, show_all: bool = False) -> list[dict]:
        item = self.workers_seq.pop(0) if self.workers_seq else Unavailable("store", "off")
        if isinstance(item, Exception):
            raise item
        return item

    def counts(self) -> dict[str, int]:
        item = self.counts_seq.pop(0)
        if isinstance(item, Exception):
            raise item
        return item

    def close_thread(self) -> None:
        self.closed += 1


def test_history_keeps_one_window_and_counts_finished_per_minute():
    h = History(window=120)
    for t, ok, bad in ((0, 0, 0), (30, 3, 1), (60, 5, 1), (90, 4, 2), (200, 10, 2)):
        h.add(Sample(when=1000.0 + t, depth={"pending": 1}, succeeded=ok, failed=bad))
    assert [s.when for s in h.samples()] == [1090.0, 1200.0], "older than the window: gone"
    h2 = History(window=3600)
    for t, ok, bad in ((0, 0, 0), (30, 3, 1), (60, 5, 1), (90, 4, 2)):
        h2.add(Sample(when=960.0 + t, depth={"pending": 1}, succeeded=ok, failed=bad))
    # minute 960: +3/+1; minute 1020: +2/+0 then a shrink (requeue) adds nothing, +0/+1
    assert h2.finished_per_minute() == [(960.0, 3, 1), (1020.0, 2, 1)]


def _sampled(data: FakeData, start: float, times: int) -> History:
    """The history after ``times`` samples of ``data``, 15 s apart from ``start`` (a fake
    clock)."""
    now = [start]
    h = History()
    s = Sampler(data, h, interval=15, clock=lambda: now[0])  # type: ignore[arg-type]
    for _ in range(times):
        s.sample_once()
        now[0] += 15
    return h


def test_sampler_samples_on_its_clock_and_logs_an_outage_once(caplog):
    data = FakeData()
    data.counts_seq = [{"pending": 4, "running": 1, "succeeded": 2, "failed": 0},
                       Unavailable("queue", "down"), Unavailable("queue", "down"),
                       {"pending": 3, "running": 2}]
    h = _sampled(data, start=100.0, times=4)
    assert [(x.when, x.depth, x.succeeded) for x in h.samples()] == [
        (100.0, {"pending": 4, "running": 1}, 2), (145.0, {"pending": 3, "running": 2}, None)]
    assert sum("dashboard sampler" in r.message for r in caplog.records) == 1


def test_sampler_thread_stops_on_its_event_and_closes_its_clients():
    data = FakeData()
    data.counts_seq = [{"pending": 0, "running": 0}] * 100
    s = Sampler(data, History(), interval=60)  # type: ignore[arg-type]
    s.start()
    s.close(timeout=10)
    assert not s._thread.is_alive() and data.closed == 1


def test_charts_are_svg_without_script_and_scale_to_the_data():
    samples = [Sample(when=1000.0 + i * 15, depth={"pending": i, "running": 1},
                      succeeded=None, failed=None) for i in range(5)]
    svg = str(depth_chart(samples, now=1060.0, window=3600))
    assert "<svg" in svg and "<script" not in svg
    assert svg.count("<polyline") == 2 and svg.count('class="dot ') == 2
    assert 'class="chart-top">4<' in svg, "the scale's top is the largest value"
    assert "no samples yet" in str(depth_chart([], now=0, window=3600))
    bars = str(finished_chart([(960.0, 3, 1)], now=1000.0, window=3600))
    assert "3 succeeded" in bars and "1 failed" in bars


def _w(worker_id: str, ok: int, bad: int) -> dict:
    return {"id": worker_id, "finished": {"succeeded": ok, "failed": bad}}


def test_without_backend_counts_finished_comes_from_the_workers_counters():
    """Azure counts neither: the chart sums the growth of each worker's own counters; what a
    worker finished before the dashboard saw it is not counted, a restart starts again."""
    data = FakeData()
    data.counts_seq = [{"pending": 1, "running": 1}] * 5
    data.workers_seq = [
        [_w("a", 10, 1)],  # a first sight counts nothing
        [_w("a", 13, 1), _w("b", 4, 4)],  # a +3
        [_w("a", 15, 2), _w("b", 6, 4)],  # a +2/+1, b +2
        [_w("a", 1, 0), _w("b", 6, 5)],  # a restarted: +1; b +0/+1
        Unavailable("control store", "down"),
    ]
    h = _sampled(data, start=960.0, times=5)
    assert [(x.succeeded, x.failed) for x in h.samples()] == [
        (0, 0), (3, 0), (7, 1), (8, 2), (None, None)]
    assert h.finished_per_minute() == [(960.0, 8, 2)]


def test_sampler_keeps_a_point_per_minute_when_the_minute_is_over():
    data = FakeData()
    data.counts_seq = [{"pending": 10 - i, "running": 2, "succeeded": 3 * i, "failed": i // 4}
                       for i in range(9)]
    _sampled(data, start=960.0, times=9)  # 960 .. 1080: minutes 960 and 1020 are over
    assert data.kept == [
        HistoryPoint(queue="default", minute=960.0, depth={"pending": 7, "running": 2},
                     succeeded=9, failed=0),  # 3 deltas (the first sample counts none)
        HistoryPoint(queue="default", minute=1020.0, depth={"pending": 3, "running": 2},
                     succeeded=12, failed=1)]


def test_a_store_that_fails_costs_a_point_and_one_log_line_never_a_sample(caplog):
    data = FakeData()
    data.counts_seq = [{"pending": i, "running": 0} for i in range(17)]
    data.keep_errors = [Unavailable("control store", "down")] * 2
    h = _sampled(data, start=960.0, times=17)  # minutes 960 .. 1200; four are over
    assert len(h.samples()) == 17, "every sample kept in memory"
    assert [p.minute for p in data.kept] == [1080.0, 1140.0]
    assert [p.succeeded for p in data.kept] == [None, None], "no counts: unknown"
    assert sum("not kept" in r.message for r in caplog.records) == 1


def test_a_new_dashboard_draws_the_last_hour_the_store_kept_at_once(fenv):
    data = data_source(fenv)
    now = time.time()
    minute = now - now % 60
    for ago, depth, ok, bad in ((90, 99, 50, 50), (30, 12, 7, 2), (20, 34, 5, 0),
                                (2, 56, 0, 1)):  # 90 min ago: outside the window
        data.put_history(HistoryPoint(queue="default", minute=minute - 60 * ago,
                                      depth={"pending": depth}, succeeded=ok, failed=bad))
    data.close_thread()
    page = create_app(data).test_client().get("/").get_data(as_text=True)
    assert "no samples yet" not in page and "no data yet" not in page
    assert '<span class="chart-top">56</span>' in page, "the depth scale: the kept points"
    assert '<span class="chart-mid">28</span>' in page
    assert "7 succeeded" in page and "2 failed" in page and "5 succeeded" in page
    assert "50 succeeded" not in page, "older than the hour drawn"
    assert ">-60 min <time>" in page and ">-30 min <time>" in page
