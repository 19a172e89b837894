"""core/signing.py and worker/task_guard.py: signatures, key files, the allow-list, task user
checks, limits, warnings."""

from __future__ import annotations

import json
import os
import signal
from dataclasses import replace

import pytest

from supervisor.core import signing
from supervisor.core.settings import Settings
from supervisor.core.signing import (
    SecurityConfigError,
    SigningKey,
    canonical,
    key_id,
    load_key,
    sign_task,
    split_paths,
)
from supervisor.core.sizes import format_size, parse_size
from supervisor.core.task import Task
from supervisor.worker import task_guard as security
from supervisor.worker.task_guard import TaskGuard

pytestmark = pytest.mark.timeout(30)

NOW = 1_700_000_000.0
KEY = SigningKey(kid=key_id(b"k" * 32), secret=b"k" * 32)
OLD = SigningKey(kid=key_id(b"o" * 32), secret=b"o" * 32)
Q = "qa"  # the queue every task here is signed for and received from


def verify(task: Task, keys: list[SigningKey], max_age: float | None, now: float) -> str | None:
    """core/signing.verify for a task received from queue Q."""
    return signing.verify(task, keys, max_age, now, queue=Q)


def settings(**kw) -> Settings:
    """A worker's settings with only the given security options (the rest: defaults)."""
    return Settings(**kw)


# --------------------------------------------------------------------------- signatures
def test_canonical_form_is_sorted_compact_json_of_six_fields():
    task = Task(cmd="echo hi", id="t1", env={"B": "2", "A": "1"}, cwd="/tmp")
    assert canonical(task, 5, "qa") == (b'{"cmd":"echo hi","cwd":"/tmp","env":{"A":"1","B":"2"},'
                                        b'"iat":5,"id":"t1","queue":"qa"}')


def test_signature_survives_the_envelope_and_stays_out_of_kwargs():
    task = sign_task(Task(cmd="echo hi", env={"A": "1"}, cwd="/tmp", max_attempts=2), KEY, NOW,
                     queue=Q)
    body = json.loads(task.to_json())
    assert set(body["jobq_sig"]) == {"v", "kid", "iat", "queue", "mac"}
    assert body["jobq_sig"]["kid"] == KEY.kid and body["jobq_sig"]["iat"] == int(NOW)
    assert set(json.loads(body["kwargs"])) == {"cmd", "env", "cwd"}  # ai4s-jobq stays happy
    again = Task.parse(task.to_json())
    assert verify(again, [KEY], None, NOW) is None
    # a Storage Queue preemption rewrites the body: the signature goes along
    assert verify(Task.parse(again.with_preemption().to_json()), [KEY], None, NOW) is None


def test_scheduling_fields_are_signed_when_set_and_older_signatures_still_verify():
    plain = Task(cmd="echo hi", id="t1")
    assert canonical(plain, 5, None) == (b'{"cmd":"echo hi","cwd":null,"env":{},"iat":5,'
                                         b'"id":"t1"}'), "unchanged for a task without them"
    signed = sign_task(Task(cmd="echo hi", id="t1", priority=8, timeout=30.0,
                            not_before=NOW + 60, unique_key="k"), KEY, NOW, queue=Q)
    assert verify(Task.parse(signed.to_json()), [KEY], None, NOW) is None
    for change in ({"priority": 9}, {"priority": 5}, {"timeout": 3000.0}, {"timeout": None},
                   {"not_before": NOW + 600}, {"unique_key": "other"}):
        tampered = replace(signed, **change)
        assert verify(tampered, [KEY], None, NOW) == "signature invalid: tampered (MAC mismatch)"


def test_every_refusal_reason():
    signed = sign_task(Task(cmd="echo hi", id="t1"), KEY, NOW, queue=Q)
    assert verify(Task(cmd="echo hi"), [KEY], None, NOW) == "signature invalid: no signature"
    for bad in ("x", {"kid": KEY.kid}, {"kid": KEY.kid, "iat": True, "mac": "00"}):
        forged = Task(cmd="echo hi", signature=bad)
        assert verify(forged, [KEY], None, NOW) == "signature invalid: malformed jobq_sig"
    assert verify(signed, [OLD], None, NOW).startswith("signature invalid: unknown key id")
    for tampered in (Task(cmd="rm -rf ~", id="t1", signature=signed.signature),
                     Task(cmd="echo hi", id="t2", signature=signed.signature),
                     Task(cmd="echo hi", id="t1", env={"LD_PRELOAD": "x"},
                          signature=signed.signature),
                     Task(cmd="echo hi", id="t1", cwd="/", signature=signed.signature),
                     Task(cmd="echo hi", id="t1",
                          signature=dict(signed.signature, iat=int(NOW) + 1)),
                     Task(cmd="echo hi", id="t1", signature=dict(signed.signature, mac="é"))):
        assert verify(tampered, [KEY], None, NOW) == "signature invalid: tampered (MAC mismatch)"
    assert verify(signed, [KEY], 60, NOW + 59) is None
    assert verify(signed, [KEY], 60, NOW + 61).startswith("signature invalid: expired")
    assert "future" in verify(signed, [KEY], 60, NOW - 3600)


def test_rotation_accepts_any_configured_key():
    by_old = sign_task(Task(cmd="true"), OLD, NOW, queue=Q)
    by_new = sign_task(Task(cmd="true"), KEY, NOW, queue=Q)
    assert verify(by_old, [KEY, OLD], None, NOW) is None
    assert verify(by_new, [KEY, OLD], None, NOW) is None
    assert verify(by_old, [KEY], None, NOW).startswith("signature invalid: unknown key id")


# ---------------------------------------------------------------------------- key files
def test_key_file_loading(tmp_path):
    (tmp_path / "a").write_bytes(b"secret-with-newline\n")
    (tmp_path / "b").write_bytes(b"secret-with-newline")
    (tmp_path / "c").write_bytes(b"crlf\r\n")
    (tmp_path / "empty").write_bytes(b"\n")
    assert load_key(str(tmp_path / "a")).secret == b"secret-with-newline"
    assert load_key(str(tmp_path / "a")).kid == load_key(str(tmp_path / "b")).kid
    assert load_key(str(tmp_path / "c")).secret == b"crlf"
    with pytest.raises(SecurityConfigError, match="--signing-key-file: .* is empty"):
        load_key(str(tmp_path / "empty"))
    with pytest.raises(SecurityConfigError, match="--signing-key-file: cannot read"):
        load_key(str(tmp_path / "missing"))
    with pytest.raises(SecurityConfigError, match="cannot read"):
        load_key(str(tmp_path))  # a directory


def test_paths_may_be_comma_separated():
    assert split_paths(["a,b", " c ", ""]) == ["a", "b", "c"]
    assert split_paths(None) == []


# ------------------------------------------------------------------------------- guard
def test_allowed_commands_is_a_full_match():
    guard = TaskGuard.from_settings(settings(allowed_commands=r"echo [a-z]+"), euid=1000)
    assert guard.refusal(Task(cmd="echo hello"), NOW, queue=Q) is None
    assert guard.refusal(Task(cmd="echo hello; rm -rf /"), NOW, queue=Q) == \
        "command not allowed (--allowed-commands)"
    assert guard.refusal(Task(cmd="xecho hello"), NOW, queue=Q) is not None
    with pytest.raises(SecurityConfigError, match="^--allowed-commands: invalid regular"):
        TaskGuard.from_settings(settings(allowed_commands="echo ("), euid=1000)


def test_signature_is_checked_before_the_allow_list(tmp_path):
    (tmp_path / "k").write_bytes(KEY.secret)
    guard = TaskGuard.from_settings(
        settings(signing_key_file=[str(tmp_path / "k")], allowed_commands="true"), euid=1000)
    assert guard.refusal(Task(cmd="false"), NOW, queue=Q) == "signature invalid: no signature"
    assert guard.refusal(sign_task(Task(cmd="true"), KEY, NOW, queue=Q), NOW, queue=Q) is None


def test_option_errors(tmp_path, monkeypatch):
    with pytest.raises(SecurityConfigError, match="^--max-task-age: needs --signing-key-file"):
        TaskGuard.from_settings(settings(max_task_age=60), euid=1000)
    with pytest.raises(SecurityConfigError, match="^--task-user: switching .* needs root"):
        TaskGuard.from_settings(settings(task_user="nobody"), euid=1000)
    with pytest.raises(SecurityConfigError, match="^--task-user: no such user"):
        TaskGuard.from_settings(settings(task_user="no-such-user-jobq"), euid=0)
    with pytest.raises(SecurityConfigError, match="^--task-group: no such group"):
        TaskGuard.from_settings(settings(task_user="root", task_group="no-such-grp"), euid=0)
    with pytest.raises(SecurityConfigError, match="^--task-group: needs --task-user"):
        TaskGuard.from_settings(settings(task_group="root"), euid=0)
    monkeypatch.setenv("PATH", str(tmp_path))  # a PATH without prlimit
    with pytest.raises(SecurityConfigError, match="^--task-cpu-limit: needs util-linux prlimit"):
        TaskGuard.from_settings(settings(task_cpu_limit=1.0, task_limits="rlimit"), euid=1000)


def test_root_warning_only_without_task_user():
    warned = TaskGuard.from_settings(settings(), euid=0).warnings
    assert len(warned) == 1 and "tasks run as root" in warned[0]
    assert TaskGuard.from_settings(settings(), euid=1000).warnings == ()
    as_root = TaskGuard.from_settings(settings(task_user="root"), euid=0)
    assert not any("tasks run as root" in w for w in as_root.warnings)


def test_task_user_spawn_options_drop_root_groups():
    guard = TaskGuard.from_settings(settings(task_user="nobody"), euid=0)
    opts = guard.spawn_options("tok:1")
    assert opts["user"] == guard.user.uid and opts["group"] == guard.user.gid
    assert 0 not in opts["extra_groups"] or guard.user.gid == 0
    env = guard.environment()
    assert env["USER"] == env["LOGNAME"] == "nobody" and env["HOME"] == guard.user.home


def test_prlimit_wrapper_and_failure_reasons():
    guard = TaskGuard.from_settings(settings(task_memory_limit=parse_size("64M"),
                                             task_cpu_limit=1.5, task_max_procs=10,
                                             task_limits="rlimit"), euid=1000)
    assert guard.limits.mechanism == "rlimit"
    prefix = guard.spawn_options("tok:1")["argv_prefix"]
    assert prefix[1:] == [f"--as={64 << 20}", "--cpu=2:3", "--nproc=10", "--"]
    assert os.path.basename(prefix[0]) == "prlimit"
    xcpu = guard.annotate_failure("killed by SIGXCPU", -signal.SIGXCPU, "")
    assert xcpu == "cpu limit of 2s exceeded (killed by SIGXCPU)"
    assert guard.annotate_failure("exit status 152", 152, "").startswith("cpu limit of 2s")
    assert "cpu limit of 2s exceeded?" in guard.annotate_failure("killed by SIGKILL",
                                                                 -signal.SIGKILL, "")
    mem = guard.annotate_failure("exit status 1", 1, "Traceback\nMemoryError")
    assert mem == "exit status 1 (memory limit 64M exceeded?)"
    assert "memory limit" in guard.annotate_failure("killed by SIGSEGV", -signal.SIGSEGV, "")
    assert guard.annotate_failure("exit status 1", 1, "no such file") == "exit status 1"
    plain = TaskGuard.from_settings(settings(), euid=1000)
    assert plain.spawn_options("tok:1")["argv_prefix"] == []
    assert plain.annotate_failure("killed by SIGXCPU", -signal.SIGXCPU, "") == \
        "killed by SIGXCPU"


def test_sizes():
    assert parse_size("512M") == 512 << 20 and parse_size("2G") == 2 << 30
    assert parse_size("100MiB") == 100 << 20 and parse_size("4096") == 4096
    assert parse_size("1.5k") == 1536
    for bad in ("", "12X", "-1M", "0"):
        with pytest.raises(ValueError):
            parse_size(bad)
    assert format_size(100 << 20) == "100M" and format_size(1000) == "1000"


def test_world_readable_secret_files_warn_once_each(tmp_path):
    ini = tmp_path / "w.ini"
    ini.write_text("[jobq-supervisor]\nconnection-string = Endpoint=x\n")
    key = tmp_path / "k"
    key.write_bytes(b"x" * 32)
    quiet = tmp_path / "q.ini"
    quiet.write_text("[jobq-supervisor]\n# connection-string =\n")
    for p in (ini, key, quiet):
        p.chmod(0o644)
    warned = security.secret_file_warnings(str(ini), [str(key)])
    assert len(warned) == 2 and str(ini) in warned[0] and str(key) in warned[1]
    assert security.secret_file_warnings(str(quiet), []) == []
    ini.chmod(0o640)
    key.chmod(0o600)
    assert security.secret_file_warnings(str(ini), [str(key)]) == []
