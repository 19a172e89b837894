"""Issue 14 (a new operator's first hour): the command lines' contract, in-process."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from supervisor import __version__
from supervisor.ctl.main import ctl_entry as ctl_main
from supervisor.ctl.main import ctl_parser
from supervisor.worker.main import UsageError, parse_worker_settings, worker_main, worker_parser


# --- bug 2: JOBQ_CONFIG is honoured by both commands, with --config's errors ---------------
def test_jobq_config_env_is_read_by_the_worker(tmp_path, monkeypatch: pytest.MonkeyPatch):
    ini = tmp_path / "w.ini"
    ini.write_text("[jobq-supervisor]\nnum-workers = 2\n")
    monkeypatch.setenv("JOBQ_CONFIG", str(ini))
    assert parse_worker_settings([]).num_workers == 2
    # a --config flag wins over the variable
    other = tmp_path / "o.ini"
    other.write_text("num-workers = 3\n")
    assert parse_worker_settings(["-c", str(other)]).num_workers == 3
    assert parse_worker_settings([f"--config={other}"]).num_workers == 3


@pytest.mark.parametrize("argv", [["size"], ["push", "-c", "true"]])
def test_jobq_config_env_missing_file_is_exit_2_on_ctl(
        tmp_path, monkeypatch: pytest.MonkeyPatch, capsys, argv):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("JOBQ_CONFIG", str(tmp_path / "nonexistent.ini"))
    assert ctl_main(argv) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "nonexistent.ini" in err
    assert not (tmp_path / "jobq.db").exists()


def test_jobq_config_env_is_read_by_ctl(tmp_path, monkeypatch: pytest.MonkeyPatch, capsys):
    monkeypatch.chdir(tmp_path)
    ini = tmp_path / "w.ini"
    ini.write_text(f"[jobq-supervisor]\nsqlite-path = {tmp_path / 'elsewhere.db'}\n")
    monkeypatch.setenv("JOBQ_CONFIG", str(ini))
    assert ctl_main(["push", "-c", "true"]) == 0
    assert (tmp_path / "elsewhere.db").exists() and not (tmp_path / "jobq.db").exists()


# --- bug 6: the shipped worker.ini keeps each backend's lease defaults ---------------------
SHIPPED_INI = str(Path(__file__).resolve().parents[2] / "conf" / "worker.ini")


@pytest.mark.parametrize("backend, extra, lock, renew", [
    ("sqlite", [], 2700.0, 120.0),
    ("storage-queue", ["--connection-string", "UseDevelopmentStorage=true"], 600.0, 200.0),
    ("servicebus", ["--namespace", "x.servicebus.windows.net"], 60.0, 20.0),
])
def test_shipped_worker_ini_keeps_backend_lease_defaults(backend, extra, lock, renew):
    s = parse_worker_settings(["--config", SHIPPED_INI, "--backend", backend, *extra])
    assert (s.lock, s.renew_every) == (lock, renew)


# --- bug 9: jobq-ctl's bad input ---------------------------------------------------------
@pytest.mark.parametrize("text, says", [("[jobq-supervisor]\nbogus = 1\n", "unknown key"),
                                        ("[other]\nx = 1\n", "unknown section")])
def test_ctl_config_unknown_key_is_exit_2_one_line(tmp_path, monkeypatch, capsys, text, says):
    monkeypatch.chdir(tmp_path)
    ini = tmp_path / "bad.ini"
    ini.write_text(text)
    assert ctl_main(["--config", str(ini), "size"]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and says in err, err
    # the worker's keys jobq-ctl has no use for are still fine ("clear": "size" of a
    # database that does not exist yet is exit 1)
    ini.write_text("[jobq-supervisor]\nnum-workers = 4\nkill-timeout = 10m\n")
    assert ctl_main(["--config", str(ini), "clear"]) == 0


def test_poll_interval_zero_says_zero_is_excluded() -> None:
    with pytest.raises(UsageError) as info:
        parse_worker_settings(["--poll-interval", "0"])
    assert "more than 0" in str(info.value) and "at most 60" in str(info.value)
    assert parse_worker_settings(["--poll-interval", "60"]).poll_interval == 60


def test_push_empty_file_says_it_held_no_command(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    empty = tmp_path / "empty.txt"
    empty.write_text("\n# only a comment\n")
    assert ctl_main(["push", "--file", str(empty)]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "held no command" in err, err


def test_requeue_of_an_unknown_id_exits_1(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert ctl_main(["push", "-c", "true"]) == 0
    capsys.readouterr()
    assert ctl_main(["requeue", "no-such-id"]) == 1
    out, err = capsys.readouterr()
    assert "requeued 0" in out and "matched no failed task" in err
    assert ctl_main(["requeue", "--all-failed"]) == 0


# --- help and docs -----------------------------------------------------------------------
def _all_parsers() -> list[argparse.ArgumentParser]:
    parsers: list[argparse.ArgumentParser] = [worker_parser(), ctl_parser()]
    for action in parsers[1]._actions:
        if isinstance(action, argparse._SubParsersAction):
            parsers += list(action.choices.values())
    return parsers


def test_every_option_of_both_commands_has_help() -> None:
    missing = [f"{p.prog} {a.option_strings or a.dest}" for p in _all_parsers()
               for a in p._actions if not (a.help or "").strip()]
    assert not missing, missing


def test_help_prints_no_default_twice_and_no_shortened_link() -> None:
    for p in _all_parsers():
        text = " ".join(p.format_help().split())
        assert "goo.gl" not in text, p.prog
        assert "(default: None)" not in text, p.prog
        for chunk in re.split(r"\n\s*-", p.format_help()):
            assert chunk.count("(default") <= 1, chunk


def test_lock_duration_help_says_service_bus_reads_the_queue() -> None:
    text = " ".join(worker_parser().format_help().split())
    assert "LockDuration" in text and "HOST:PID" in text


@pytest.mark.parametrize("main", [ctl_main, worker_main])
def test_version(main, capsys) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0 and __version__ in capsys.readouterr().out


@pytest.mark.parametrize("name", ["JOBQ_TASK_ID", "JOBQ_ATTEMPT", "JOBQ_QUEUE_NAME"])
def test_push_refuses_the_variables_the_worker_sets(tmp_path, monkeypatch, capsys, name):
    monkeypatch.chdir(tmp_path)
    assert ctl_main(["push", "-c", "true", "--env", f"{name}=x"]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and name in err
    assert ctl_main(["push", "-c", "true", "--env", "MODE=fast"]) == 0


@pytest.mark.parametrize("columns", [None, "57", "0", "wide"])
def test_help_is_as_wide_as_argparse_makes_it(columns, monkeypatch: pytest.MonkeyPatch):
    """The parsers' help formatter finds the width without shutil (start-up: shutil imports
    bz2 and lzma), and finds the one argparse would."""
    from supervisor.core.options import _HelpFormatter

    if columns is None:
        monkeypatch.delenv("COLUMNS", raising=False)
    else:
        monkeypatch.setenv("COLUMNS", columns)
    assert _HelpFormatter("jobq-ctl")._width == argparse.HelpFormatter("jobq-ctl")._width
