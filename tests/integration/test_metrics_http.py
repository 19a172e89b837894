"""Issue 30 point 3: ``--metrics-port`` serves the worker's metrics over HTTP (loopback),
scraped here as Prometheus would and parsed with prometheus-client's own parser; a port in
use is one line and exit status 2."""

from __future__ import annotations

import re
import signal
import socket
import urllib.error
import urllib.request

import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import wait_for

pytestmark = pytest.mark.timeout(90)


def scrape(url: str) -> dict[str, float]:
    """The samples of one scrape, by name (every series here has the same labels)."""
    with urllib.request.urlopen(url, timeout=10) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/plain")
        text = resp.read().decode()
    return {s.name: s.value for family in text_string_to_metric_families(text)
            for s in family.samples}


def test_a_running_task_is_counted_in_the_scrape(env):
    env.push("sleep 60")
    sup = env.supervisor("--metrics-port", "0", "--metrics-interval", "0.2")
    sup.wait_log("metrics served at http://127.0.0.1:")
    port = int(re.search(r"metrics served at http://127\.0\.0\.1:(\d+)/metrics",
                         sup.log()).group(1))
    assert port > 0
    listening = [c for c in psutil.Process(sup.pid).net_connections("tcp")
                 if c.status == psutil.CONN_LISTEN and c.laddr.port == port]
    assert [c.laddr.ip for c in listening] == ["127.0.0.1"]  # the default: loopback only
    url = f"http://127.0.0.1:{port}/metrics"

    def running() -> dict[str, float] | None:
        g = scrape(url)
        return g if g.get("jobq_tasks_running") == 1 else None

    g = wait_for(running, 30, what="jobq_tasks_running 1 in a scrape")
    assert isinstance(g, dict)
    assert g["jobq_tasks_started_total"] == 1
    assert g["jobq_slots_busy"] == 1 and g["jobq_slots_total"] == 1
    assert g["jobq_tasks_succeeded_total"] == 0
    assert g["jobq_up"] == 1
    assert g["jobq_supervisor_resident_memory_bytes"] > 0

    sup.signal(signal.SIGTERM)  # the task is requeued; the server stops with the worker
    assert sup.wait(60) == 0
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(url, timeout=5)
    assert "Traceback" not in sup.log()


def test_a_port_in_use_is_one_line_and_exit_2(env):
    env.push("true")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        sup = env.supervisor("--metrics-port", str(port))
        code = sup.wait(60)
    log = sup.log()
    assert code == 2, log
    assert f"jobq-supervisor: error: --metrics-port: cannot listen on 127.0.0.1:{port}: " \
           "Address already in use" in log
    assert "Traceback" not in log
    assert [line for line in log.splitlines() if "error" in line.lower()] == [
        f"jobq-supervisor: error: --metrics-port: cannot listen on 127.0.0.1:{port}: "
        "Address already in use"]
    assert env.rows()[0][1] == "pending"  # no task ran
