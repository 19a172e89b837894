"""worker/reload.py: a reload (SIGUSR2) re-reads the start's command line, environment and config
file with the real parser; it applies the log level, names what waits for a restart, refuses
a broken file in one ERROR line, and always ends the RELOADING=1 it told systemd."""

from __future__ import annotations

import logging
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from supervisor.core.settings import Settings
from supervisor.worker.main import reread_settings
from supervisor.worker.reload import Reloader

pytestmark = pytest.mark.timeout(30)


class FakeNotifier:
    def __init__(self) -> None:
        self.sent: list[str] = []

    def reloading(self) -> bool:
        self.sent.append("RELOADING=1")
        return True

    def ready(self) -> bool:
        self.sent.append("READY=1")
        return True


@pytest.fixture(autouse=True)
def root_level() -> Any:
    """A reload sets the process's log level: each test gets the one it found back."""
    root, azure = logging.getLogger(), logging.getLogger("azure")
    levels = root.level, azure.level
    yield
    root.setLevel(levels[0])
    azure.setLevel(levels[1])


def setup(tmp_path: Path, text: str, *flags: str, env: dict[str, str] | None = None,
          ready: bool = True) -> tuple[Path, Reloader, FakeNotifier]:
    ini = tmp_path / "worker.ini"
    ini.write_text(text)
    argv = ["--config", str(ini), *flags]
    started = reread_settings(argv, env or {}, "")  # as the start parsed them
    notifier = FakeNotifier()
    reloader = Reloader(started, partial(reread_settings, argv, env or {}), notifier,
                        lambda: ready)
    return ini, reloader, notifier


def test_a_new_log_level_applies_at_once(tmp_path: Path, caplog: Any) -> None:
    caplog.set_level(logging.INFO)
    ini, reloader, notifier = setup(tmp_path, "log-level = INFO\nnum-workers = 2\n")
    ini.write_text("log-level = debug\nnum-workers = 2\n")
    reloader.reload()
    assert logging.getLogger().level == logging.DEBUG
    assert logging.getLogger("azure").level == logging.WARNING
    assert f"reload of {ini}: log-level INFO -> DEBUG" in caplog.text
    assert "next restart" not in caplog.text
    assert notifier.sent == ["RELOADING=1", "READY=1"]
    caplog.clear()
    reloader.reload()  # the file as it is: nothing more to do
    assert "nothing to change now" in caplog.text and "next restart" not in caplog.text


def test_a_quieter_level_still_tells_the_reload(tmp_path: Path, caplog: Any) -> None:
    caplog.set_level(logging.INFO)
    ini, reloader, _ = setup(tmp_path, "log-level = INFO\n")
    ini.write_text("log-level = WARNING\n")
    reloader.reload()
    assert "log-level INFO -> WARNING" in caplog.text
    assert logging.getLogger().level == logging.WARNING


def test_other_changes_are_named_as_waiting_for_a_restart(tmp_path: Path, caplog: Any) -> None:
    ini, reloader, _ = setup(tmp_path, "num-workers = 2\nkill-timeout = 60\n")
    ini.write_text("num-workers = 4\nkill-timeout = 60\nqueue = other\n")
    reloader.reload()
    [line] = [r for r in caplog.records if "next restart" in r.getMessage()]
    assert line.levelno == logging.WARNING
    assert line.getMessage().endswith(": queue, num-workers")
    assert logging.getLogger().level != logging.DEBUG


def test_a_flag_and_the_environment_still_win_over_the_file(tmp_path: Path,
                                                            caplog: Any) -> None:
    caplog.set_level(logging.INFO)
    ini, reloader, _ = setup(tmp_path, "num-workers = 2\n", "--num-workers", "3",
                             env={"JOBQ_LOG_LEVEL": "WARNING"})
    ini.write_text("num-workers = 5\nlog-level = DEBUG\n")
    reloader.reload()
    assert "next restart" not in caplog.text
    assert "nothing to change now" in caplog.text


@pytest.mark.parametrize("text, problem", [
    ("num-workers = many\n", "line 1: num-workers: invalid int value 'many'"),
    ("num-workers = 2\nbogus = 1\n", "line 2: unknown key 'bogus'"),
    ("num-workers = 0\n", "line 1: num-workers: must be at least 1"),
    ("allowed-commands = (\n", "--allowed-commands: invalid regular expression"),
])
def test_a_broken_file_is_one_error_line_and_changes_nothing(tmp_path: Path, caplog: Any,
                                                             text: str, problem: str) -> None:
    ini, reloader, notifier = setup(tmp_path, "num-workers = 2\n")
    level = logging.getLogger().level
    ini.write_text(text + "log-level = DEBUG\n")
    reloader.reload()
    errors = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(errors) == 1 and errors[0].levelno == logging.ERROR, caplog.text
    message = errors[0].getMessage()
    assert "reload refused, the worker goes on with its settings as they were" in message
    assert problem in message and "\n" not in message
    assert logging.getLogger().level == level
    assert notifier.sent == ["RELOADING=1", "READY=1"]  # the unit leaves "reloading"


def test_a_missing_file_is_refused(tmp_path: Path, caplog: Any) -> None:
    ini, reloader, _ = setup(tmp_path, "num-workers = 2\n")
    ini.unlink()
    reloader.reload()
    assert f"--config: cannot read {ini}: No such file or directory" in caplog.text


def test_before_the_start_is_ready_systemd_hears_nothing(tmp_path: Path) -> None:
    """A READY=1 sent by a reload before the start's own would end the start too early."""
    _, reloader, notifier = setup(tmp_path, "num-workers = 2\n", ready=False)
    reloader.reload()
    assert notifier.sent == []


def test_a_generated_worker_id_is_no_change(tmp_path: Path, caplog: Any) -> None:
    _, reloader, _ = setup(tmp_path, "num-workers = 2\n")
    assert reloader.started.worker_id  # HOST:PID:random, made at start
    reloader.reload()
    assert "next restart" not in caplog.text


def test_an_in_process_worker_has_nothing_to_reread(caplog: Any) -> None:
    notifier = FakeNotifier()
    Reloader(Settings(), None, notifier, lambda: True).reload()
    assert "nothing to re-read" in caplog.text
    assert notifier.sent == ["RELOADING=1", "READY=1"]
