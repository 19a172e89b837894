"""``--metrics-port`` and ``--metrics-address`` (issue 30 point 3) are worker options like the
others: a flag, an INI key, a ``JOBQ_`` variable; off and loopback by default; a port out of
range is one line naming the option (the port in use: tests/integration/test_metrics_http.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from supervisor.worker.main import UsageError, parse_worker_settings


def test_off_and_loopback_by_default() -> None:
    s = parse_worker_settings([])
    assert (s.metrics_port, s.metrics_address) == (None, "127.0.0.1")


def test_flag_env_and_ini_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = tmp_path / "worker.ini"
    cfg.write_text("[jobq-supervisor]\nmetrics-port = 9464\nmetrics-address = 0.0.0.0\n")
    s = parse_worker_settings(["--config", str(cfg)])
    assert (s.metrics_port, s.metrics_address) == (9464, "0.0.0.0")
    monkeypatch.setenv("JOBQ_METRICS_PORT", "0")
    assert parse_worker_settings(["--config", str(cfg)]).metrics_port == 0
    assert parse_worker_settings(["--config", str(cfg), "--metrics-port", "9100"]
                                 ).metrics_port == 9100


@pytest.mark.parametrize("port", ["70000", "-1"])
def test_a_port_out_of_range_names_the_option(port: str) -> None:
    with pytest.raises(UsageError, match=r"^--metrics-port: must be 0\.\.65535"):
        parse_worker_settings(["--metrics-port", port])
