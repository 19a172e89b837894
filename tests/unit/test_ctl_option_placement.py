"""Issue 30, 8 (CLI habits): jobq-ctl takes ``--config`` and every backend option before or
after the command; ``-c`` stays push's command and, before the command, is refused with one
line pointing at ``--config`` (exit 2).  Parsing in-process; one real process for the exit
status and its line."""

from __future__ import annotations

import pytest

from supervisor.core.options import UsageError, _parse
from supervisor.ctl.commands import COMMANDS
from supervisor.ctl.guards import refuse_short_config
from supervisor.ctl.main import ctl_main, ctl_parser

pytestmark = pytest.mark.timeout(60)

# What each command needs besides options, so that it parses.
ARGS = {"logs": ["c040527d"], "result": ["c040527d"], "cancel": ["c040527d"],
        "drain": ["w1"], "stop": ["w1"], "push": ["-c", "true"]}


@pytest.fixture
def ini(tmp_path, monkeypatch):
    monkeypatch.delenv("JOBQ_CONFIG", raising=False)
    path = tmp_path / "w.ini"
    path.write_text("[jobq-supervisor]\nqueue = from-ini\nsqlite-path = q.db\n")
    return str(path)


def _settings(argv: list[str]):
    parser = ctl_parser()
    return parser.settings(_parse(parser, argv))


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_config_and_backend_options_work_before_or_after_the_command(ini, tmp_path,
                                                                     command) -> None:
    rest = ARGS.get(command, [])
    before = _settings(["--config", ini, command, *rest])
    after = _settings([command, *rest, "--config", ini])
    assert before.queue == after.queue == "from-ini"
    assert before.sqlite_path == after.sqlite_path == str(tmp_path / "q.db")
    moved = _settings([command, *rest, "--config", ini, "--queue", "other", "--backend",
                       "postgres", "--postgres-schema", "s2"])
    assert (moved.queue, moved.backend, moved.postgres_schema) == ("other", "postgres", "s2")


def test_push_keeps_c_for_its_command_and_prune_takes_retention_after(ini) -> None:
    parser = ctl_parser()
    ns = _parse(parser, ["push", "-c", "echo a", "--config", ini, "-c", "echo b"])
    assert ns.commands == ["echo a", "echo b"]
    assert parser.settings(ns).queue == "from-ini"
    ns = _parse(parser, ["prune", "--retention", "2d"])
    assert ns.retention == 2 * 86400


@pytest.mark.parametrize("argv", [["-c", "w.ini", "status"], ["-cw.ini", "size"],
                                  ["--queue", "q", "-c", "w.ini"]])
def test_c_before_the_command_says_to_use_config(ini, capsys, argv) -> None:
    assert ctl_main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--config FILE" in err and "push's command" in err
    with pytest.raises(UsageError):
        refuse_short_config(argv, COMMANDS)


def test_jobq_ctl_c_ini_status_is_exit_2_with_one_line(env, ini) -> None:
    res = env.ctl("-c", ini, "status", check=False)
    assert res.returncode == 2
    assert res.stderr == ("jobq-ctl: error: -c: on jobq-ctl, -c is push's command (push -c "
                          "CMD); give the config file as --config FILE, before or after the "
                          "command\n")
    assert res.stdout == ""


def test_config_after_the_command_in_every_spelling(ini, tmp_path) -> None:
    """``--config=FILE`` and an unambiguous abbreviation (argparse's allow_abbrev) after the
    command read the file as before it; several: the last wins, also across the command."""
    other = tmp_path / "o.ini"
    other.write_text("[jobq-supervisor]\nqueue = from-other\n")
    assert _settings(["status", f"--config={ini}"]).queue == "from-ini"
    assert _settings(["status", "--conf", ini]).queue == "from-ini"
    assert _settings(["status", "--config", ini, "--config", str(other)]).queue == "from-other"
    assert _settings(["--config", str(other), "status", "--config", ini]).queue == "from-ini"
    assert _settings(["--config", ini, "status", "--config", str(other)]).queue == "from-other"


def test_config_flag_leaves_values_and_positionals_alone(ini) -> None:
    """What argparse reads as a value or a positional stays one: a push command that says
    --config, anything after ``--``; a line argparse refuses is refused as before."""
    from supervisor.core.config_flag import config_before_command

    parser = ctl_parser()
    argv = ["--queue", "q", "push", "-c", f"x --config {ini}", "--", "--config", ini]
    assert config_before_command(parser, argv) == argv
    moved = config_before_command(parser, ["--queue", "q", "push", "-c", "x", "--config", ini])
    assert moved == ["--queue", "q", "--config", ini, "push", "-c", "x"]
    assert config_before_command(parser, ["--bogus", "status", "--config", ini]) == [
        "--bogus", "status", "--config", ini]
    with pytest.raises(UsageError):
        _parse(parser, ["--bogus", "status", "--config", ini])


def test_help_reads_no_config_file(capsys) -> None:
    for argv in (["--config", "/nonexistent.ini", "--help"],
                 ["status", "--config", "/nonexistent.ini", "--help"]):
        with pytest.raises(SystemExit) as exit_:
            ctl_main(argv)
        assert exit_.value.code == 0
        assert "usage: jobq-ctl" in capsys.readouterr().out
