"""worker/env_policy.py: which env names and working directories a fenced worker refuses."""

from __future__ import annotations

import pytest

from supervisor.worker.env_policy import HARMLESS, REFUSED, EnvPolicy

pytestmark = pytest.mark.timeout(10)


def policy(**kw) -> EnvPolicy:
    kw.setdefault("own_dir", "/srv/own")
    return EnvPolicy.from_settings(True, **kw)


@pytest.mark.parametrize("name", [
    "BASH_ENV", "ENV", "BASH_FUNC_echo%%", "SHELLOPTS", "BASHOPTS", "PS4", "IFS", "LD_PRELOAD",
    "LD_LIBRARY_PATH", "PATH", "PYTHONPATH", "PYTHONSTARTUP", "GIT_SSH_COMMAND", "NODE_OPTIONS",
    "PERL5OPT", "JAVA_TOOL_OPTIONS", "GCONV_PATH", "HOME"])
def test_names_that_change_what_runs_are_refused(name):
    assert policy().refusal({name: "x"}, None) == (f"environment variable {name!r} not allowed "
                                                   f"(--allowed-env)")


@pytest.mark.parametrize("name", ["MODE", "CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS", "PATHS",
                                  "MYPATH", "LANG", "TZ", *sorted(HARMLESS)])
def test_ordinary_and_harmless_names_pass(name):
    assert policy().refusal({name: "x"}, None) is None


def test_not_enforced_refuses_nothing():
    off = EnvPolicy.from_settings(False, own_dir="/srv/own")
    assert off.refusal({"LD_PRELOAD": "x"}, "/elsewhere") is None


def test_allowed_names_and_patterns_and_refused_additions():
    p = policy(allowed_env=("PYTHONPATH", "GIT_*"), refused_env=("MY_*", "PYTHONUNBUFFERED"))
    assert p.refusal({"PYTHONPATH": "x", "GIT_DIR": "y"}, None) is None
    assert p.refusal({"PYTHONHOME": "x"}, None) is not None
    assert "MY_TOOL" in p.refusal({"MY_TOOL": "x"}, None)
    assert "PYTHONUNBUFFERED" in p.refusal({"PYTHONUNBUFFERED": "1"}, None)
    assert len(REFUSED) == len(set(REFUSED))


def test_cwd(tmp_path):
    (tmp_path / "jobs" / "a").mkdir(parents=True)
    (tmp_path / "link").symlink_to(tmp_path / "jobs")
    p = policy(allowed_cwd=(str(tmp_path / "link"), f"{tmp_path}/jobs/*"))
    assert p.refusal({}, str(tmp_path / "jobs")) is None  # the link, resolved
    assert p.refusal({}, str(tmp_path / "jobs" / "a")) is None
    assert p.refusal({}, str(tmp_path)) == (f"working directory {str(tmp_path)!r} not allowed "
                                            f"(--allowed-cwd)")
    assert policy().refusal({}, "/srv/own") is None and policy().refusal({}, "/srv") is not None
    assert policy().refusal({}, None) is None
