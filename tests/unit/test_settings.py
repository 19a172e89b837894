"""Settings: durations, the safety margin, renewal defaults, validation, and the CLI layering."""

from __future__ import annotations

import argparse
import math
import os
from dataclasses import fields, replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from supervisor.core.config_file import CLI_ONLY_ATTR
from supervisor.core.settings import Settings, SettingsError, parse_duration, safety_margin
from supervisor.ctl.main import ctl_parser
from supervisor.worker.main import UsageError, parse_worker_settings, worker_parser

pytestmark = pytest.mark.timeout(30)


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No JOBQ_* variable of the machine running the tests may leak into the parser."""
    for name in list(os.environ):
        if name.startswith("JOBQ_"):
            monkeypatch.delenv(name)


# --------------------------------------------------------------------------- parse_duration
@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("45", 45.0),
        ("45s", 45.0),
        ("10m", 600.0),
        ("2h", 7200.0),
        ("1d", 86400.0),
        ("0.5", 0.5),
        (".5", 0.5),
        ("1.5m", 90.0),
        ("10M", 600.0),
        (" 3 s ", 3.0),
        ("0", 0.0),
    ],
)
def test_parse_duration_accepts(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize(
    "text",
    ["", " ", "abc", "-5", "+5", "5x", "5ms", "1e3", "nan", "inf", "1.2.3", "m", "5 m s", "1,5",
     "10mm", "s10"],
)
def test_parse_duration_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        parse_duration(text)


@settings(database=None)
@given(st.text(max_size=20))
def test_parse_duration_raises_only_value_error(text: str) -> None:
    try:
        value = parse_duration(text)
    except ValueError:
        return
    assert value >= 0 and not math.isnan(value)


# --------------------------------------------------------------------------- safety_margin
@pytest.mark.parametrize(
    ("lock", "margin"),
    [
        (2700.0, 270.0),  # 10 %
        (600.0, 60.0),
        (60.0, 6.0),
        (20.0, 2.0),  # the 2 s floor
        (10.0, 2.0),  # the floor beats 10 %
        (6.0, 2.0),  # floor == lock/3
        (3.0, 1.0),  # capped at lock/3 so a short lock keeps slack
        (1.5, 0.5),
    ],
)
def test_safety_margin(lock: float, margin: float) -> None:
    assert safety_margin(lock) == pytest.approx(margin)


@settings(database=None)
@given(st.floats(min_value=0.001, max_value=1e7, allow_nan=False))
def test_safety_margin_bounds(lock: float) -> None:
    m = safety_margin(lock)
    assert m <= lock / 3.0 + 1e-9
    assert m >= min(2.0, lock / 3.0) - 1e-9
    assert m >= min(0.1 * lock, lock / 3.0) - 1e-9


# --------------------------------------------------------------------------- renew_every
def test_renew_every_sqlite_default_is_120_with_its_2700_lock() -> None:
    s = Settings()
    assert s.lock == 2700.0
    assert s.renew_every == 120.0
    assert Settings(lock_duration=2700.0).renew_every == 120.0


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({"backend": "servicebus"}, 20.0),  # 60 s lock
        ({"backend": "storage-queue"}, 200.0),  # 600 s lock
        ({"backend": "storage-queue", "lock_duration": 90.0}, 30.0),
        ({"lock_duration": 60.0}, 20.0),  # SQLite's 120 s default would not fit a 60 s lock
        ({"lock_duration": 200.0}, 200.0 / 3.0),
    ],
)
def test_renew_every_is_lock_over_3_for_short_locks(kwargs: dict, expected: float) -> None:
    assert Settings(**kwargs).renew_every == pytest.approx(expected)


def test_renew_every_capped_at_lock_minus_renew_before() -> None:
    # lock/3 = 4, but lock - renew_before = 2 is earlier
    s = Settings(backend="servicebus", lock_duration=12.0, renew_before=10.0)
    assert s.renew_every == pytest.approx(2.0)


def test_renew_every_cap_ignored_when_not_positive() -> None:
    s = Settings(backend="servicebus", lock_duration=6.0, renew_before=10.0)
    assert s.renew_every == pytest.approx(2.0)  # lock/3; lock - renew_before < 0 is ignored
    s = Settings(backend="servicebus", lock_duration=9.0, renew_before=9.0)
    assert s.renew_every == pytest.approx(3.0)  # lock - renew_before == 0 is ignored too


def test_renew_every_explicit_flag_wins() -> None:
    assert Settings(renew_interval=7.0).renew_every == 7.0
    assert Settings(backend="servicebus", renew_interval=5.0).renew_every == 5.0


# --------------------------------------------------------------------------- validate
def test_defaults_validate() -> None:
    for backend in ("sqlite", "storage-queue", "servicebus"):
        creds = {} if backend == "sqlite" else {"connection_string": "x"}
        Settings(backend=backend, **creds).validate()


@pytest.mark.parametrize("backend", ["storage-queue", "servicebus"])
def test_azure_backends_need_exactly_one_credential(backend) -> None:
    other = {"account_url": "https://a"} if backend == "storage-queue" else {"namespace": "n"}
    with pytest.raises(SettingsError, match="exactly one"):
        Settings(backend=backend).validate()
    with pytest.raises(SettingsError, match="exactly one"):
        Settings(backend=backend, connection_string="x", **other).validate()
    Settings(backend=backend, **other).validate()


def _error(**kwargs) -> str:
    with pytest.raises(SettingsError) as info:
        Settings(**kwargs).validate()
    return str(info.value)


def test_renew_interval_too_long_for_the_lock() -> None:
    # 2700 s lock, 270 s margin: a renewal at 2430 s or later cannot work
    assert _error(renew_interval=2430.0).startswith("--renew-interval")
    assert _error(renew_interval=3000.0).startswith("--renew-interval")
    Settings(renew_interval=2429.0).validate()
    assert _error(backend="servicebus", connection_string="x",
                  renew_interval=54.0).startswith("--renew-interval")


@pytest.mark.parametrize(
    ("kwargs", "option"),
    [
        ({"num_workers": 0}, "--num-workers"),
        ({"num_workers": -3}, "--num-workers"),
        ({"queue": "bad name"}, "--queue"),
        ({"queue": ""}, "--queue"),
        ({"queue": "-leading-dash"}, "--queue"),
        ({"queue": "x" * 64}, "--queue"),
        ({"queue": "q/../etc"}, "--queue"),
        ({"kill_timeout": -1.0}, "--kill-timeout"),
        ({"retry_delay": -1.0}, "--retry-delay"),
        ({"renew_before": -1.0}, "--renew-before"),
        ({"stale_lock_age": -1.0}, "--stale-lock-age"),
        ({"backend": "storage-queue", "connection_string": "x", "lock_duration": 604801.0},
         "--lock-duration"),
        ({"backend": "storage-queue", "connection_string": "x", "lock_duration": 0.5},
         "--lock-duration"),
        ({"lock_duration": 0.0}, "--lock-duration"),
        ({"renew_interval": 0.0}, "--renew-interval"),
        ({"backend": "redis"}, "--backend"),
        ({"lock_lost_behavior": "sighup"}, "--lock-lost-behavior"),
        ({"max_attempts": 0}, "--max-attempts"),
        ({"task_time_limit": 0.0}, "--task-time-limit"),
        ({"poll_interval": 0.0}, "--poll-interval"),
        ({"log_format": "xml"}, "--log-format"),
        ({"log_level": "LOUD"}, "--log-level"),
    ],
)
def test_validate_names_the_option(kwargs: dict, option: str) -> None:
    message = _error(**kwargs)
    assert message.startswith(option + ":"), message


@pytest.mark.parametrize("visibility", [1.0, 604800.0])
def test_storage_queue_visibility_bounds_are_inclusive(visibility: float) -> None:
    Settings(backend="storage-queue", connection_string="x", lock_duration=visibility).validate()


def test_repr_hides_the_connection_string() -> None:
    s = Settings(connection_string="DefaultEndpointsProtocol=https;AccountKey=SECRET")
    assert "SECRET" not in repr(s)
    assert "SECRET" not in str(s)
    assert "redacted" in repr(s)
    assert "queue='default'" in repr(s)  # the rest is still shown


# --------------------------------------------------------------------------- CLI layering
def _ini(tmp_path, text: str) -> str:
    path = tmp_path / "worker.ini"
    path.write_text(text)
    return str(path)


def test_cli_defaults() -> None:
    s = parse_worker_settings([])
    assert s.num_workers == 1
    assert s.lock_duration is None
    assert s.kill_timeout == 600.0
    assert s.worker_id  # generated when not given
    assert replace(s, worker_id="") == Settings()  # nothing given: the dataclass's defaults


def test_every_cli_default_is_the_settings_default() -> None:
    """One copy of each default: every option of both commands that sets a Settings field
    defaults to that field's default, and every Settings field has a worker option."""
    defaults = {f.name: f.default for f in fields(Settings)}
    seen: dict[str, set[str]] = {"jobq-supervisor": set(), "jobq-ctl": set()}
    for parser in (worker_parser(), ctl_parser()):
        for action in parser._actions:
            if action.dest in ("help", "version", "command") or getattr(
                    action, CLI_ONLY_ATTR, False):  # --check-config: what to do, no setting
                continue
            assert action.dest in defaults, f"{parser.prog}: {action.dest} is no Settings field"
            if action.default is argparse.SUPPRESS:  # an alias (--visibility-timeout)
                continue
            assert action.default == defaults[action.dest], f"{parser.prog}: {action.dest}"
            seen[parser.prog].add(action.dest)
    assert seen["jobq-supervisor"] == set(defaults)
    assert {"backend", "queue", "sqlite_path", "signing_key_file"} <= seen["jobq-ctl"]


def test_cli_config_file_beats_default(tmp_path) -> None:
    cfg = _ini(tmp_path, "[jobq-supervisor]\nnum-workers = 3\nkill-timeout = 2m\n")
    s = parse_worker_settings(["--config", cfg])
    assert s.num_workers == 3
    assert s.kill_timeout == 120.0
    assert parse_worker_settings(["-c", cfg]).num_workers == 3


def test_cli_env_beats_config_file(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = _ini(tmp_path, "[jobq-supervisor]\nnum-workers = 3\n")
    monkeypatch.setenv("JOBQ_NUM_WORKERS", "5")
    assert parse_worker_settings(["--config", cfg]).num_workers == 5


def test_cli_flag_beats_env_and_config_file(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = _ini(tmp_path, "[jobq-supervisor]\nnum-workers = 3\n")
    monkeypatch.setenv("JOBQ_NUM_WORKERS", "5")
    assert parse_worker_settings(["--config", cfg, "--num-workers", "7"]).num_workers == 7
    assert parse_worker_settings(["-n", "8", "--config", cfg]).num_workers == 8


def test_cli_env_beats_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JOBQ_KILL_TIMEOUT", "30s")
    monkeypatch.setenv("JOBQ_QUEUE", "builds")
    s = parse_worker_settings([])
    assert s.kill_timeout == 30.0
    assert s.queue == "builds"


def test_cli_unknown_option_is_usage_error() -> None:
    with pytest.raises(UsageError):
        parse_worker_settings(["--no-such-option", "1"])


def test_cli_malformed_duration_names_the_option() -> None:
    with pytest.raises(UsageError) as info:
        parse_worker_settings(["--kill-timeout", "10 minutes"])
    assert "--kill-timeout" in str(info.value)


def test_cli_malformed_duration_from_env_is_usage_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JOBQ_LOCK_DURATION", "forever")
    with pytest.raises(UsageError) as info:
        parse_worker_settings([])
    assert "lock-duration" in str(info.value)


def test_cli_invalid_setting_is_usage_error_naming_the_option() -> None:
    with pytest.raises(UsageError) as info:
        parse_worker_settings(["--renew-interval", "1h"])
    assert str(info.value).startswith("--renew-interval")
    with pytest.raises(UsageError) as info:
        parse_worker_settings(["--num-workers", "0"])
    assert str(info.value).startswith("--num-workers")


def test_cli_visibility_timeout_is_an_alias_of_lock_duration() -> None:
    s = parse_worker_settings(["--backend", "storage-queue", "--visibility-timeout", "5m",
                               "--connection-string", "UseDevelopmentStorage=true"])
    assert s.lock_duration == 300.0
    assert s.lock == 300.0
    assert parse_worker_settings(["--lock-duration", "90"]).lock_duration == 90.0


def test_cli_connection_string_not_in_repr(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JOBQ_CONNECTION_STRING", "AccountKey=SECRET")
    s = parse_worker_settings([])
    assert s.connection_string == "AccountKey=SECRET"
    assert "SECRET" not in repr(s)


def test_reaper_defaults_are_per_backend() -> None:
    """PostgreSQL takes an expired lease back within ~10 s of its lock's end (a pass every
    10 s, no stale age); SQLite keeps its 5-minute pass and a stale age of one lock; a value
    given is the value, for every backend."""
    pg = Settings(backend="postgres")
    assert (pg.reaper_every, pg.stale_age) == (10.0, 0.0)
    lite = Settings(backend="sqlite")
    assert (lite.reaper_every, lite.stale_age) == (300.0, lite.lock)
    for backend in ("postgres", "sqlite"):
        given = Settings(backend=backend, reaper_interval=0.0, stale_lock_age=60.0)
        assert (given.reaper_every, given.stale_age) == (0.0, 60.0)
    with pytest.raises(SettingsError, match="--reaper-interval"):
        Settings(backend="postgres", reaper_interval=-1.0).validate()
