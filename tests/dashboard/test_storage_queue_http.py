"""Issue 26, section 4: the dashboard over HTTP (the Flask test client) on a Storage Queue
worker's Azurite queue, with its control store in Azurite's table service: the depth chart
draws the count the backend reports (``queued``) under its word."""

from __future__ import annotations

import re

import pytest

from supervisor.backends.storage_queue import StorageQueueBackend
from supervisor.control.azure_table import AzureTableControlStore
from supervisor.dashboard.app import create_app
from supervisor.dashboard.data import DataSource
from supervisor.dashboard.history import History, Sampler
from tests.azure.test_storage_queue_worker import sq  # noqa: F401 (fixture)
from tests.control.conftest import table_connection_string

pytestmark = [pytest.mark.azure, pytest.mark.timeout(120)]
FAST = ("--control-interval", "1", "--heartbeat-interval", "1", "--poll-interval", "0.2")


def _data(sq, table_port: int | None = None) -> DataSource:  # noqa: F811
    conn = table_connection_string(table_port) if table_port else None
    return DataSource(
        sq.queue, lambda: StorageQueueBackend(sq.queue, connection_string=sq.conn_str,
                                              create=False),
        lambda: AzureTableControlStore(connection_string=conn) if conn else None)


def test_the_depth_chart_draws_what_storage_queue_counts_under_its_word(sq):  # noqa: F811
    sq.push("true", "true", "true")
    data = _data(sq)
    history = History()
    sampler = Sampler(data, history)
    sampler.sample_once()
    page = create_app(data, history).test_client().get("/").get_data(as_text=True)
    chart = page[page.index('id="depth"'):]
    chart = chart[:chart.index("</figure>")]
    # the one line drawn is "queued", at the scale's top (3 of 3): not a flat 0 "pending"
    assert re.findall(r'<polyline class="(\w+)"', chart) == ["queued"]
    assert 'class="chart-top">3<' in chart
    (y,) = re.findall(r'class="dot queued" x1="[\d.]+" y1="([\d.]+)"', chart)
    assert float(y) == 4.0, "the latest value drawn is 3, the top of the scale"
    legend = re.sub(r"<[^>]+>", "", chart[chart.index("<figcaption>"):]).split()
    assert legend == ["queued"], "the legend says the backend's word, and only it"
    data.close_thread()
