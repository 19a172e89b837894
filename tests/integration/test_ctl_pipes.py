"""Issue 25, class 4: ``jobq-ctl ... | head -1`` in a real shell pipeline.  A reader of stdout
that went away ends every command quietly -- no BrokenPipeError traceback -- with the
command's own exit status; ``push`` pushed every task and says so with 0 (a script that
retried on the old exit 1 duplicated them)."""

from __future__ import annotations

import os
import signal
import subprocess

import pytest

from tests.conftest import command

pytestmark = pytest.mark.timeout(120)

MANY = 3000  # ids of 33 bytes: ~100 KB, more than a pipe and head's read take

# The reader is gone before jobq-ctl writes a byte, whatever its output's size: head takes
# the first line of a printf, the right side closes its stdin, then lets the left go on.
CLOSED_FIRST = ('( printf "x\\n"; cat "$GONE" > /dev/null; "$@" 2> "$ERR"; echo $? > "$RC" )'
                ' | ( head -1 > /dev/null; exec 0<&-; : > "$GONE" )')
# The plain pipeline: head leaves after the first line of jobq-ctl's own output.
PLAIN = '"$@" 2> "$ERR" | head -1 > "$FIRST"; echo "${PIPESTATUS[0]}" > "$RC"'


def _piped(env, script: str, *args: str, buffered: bool = False) -> tuple[int, str, str]:
    """Run ``jobq-ctl ARGS`` in ``script``: its exit status, its stderr, what head printed.
    ``buffered``: stdout as an operator's (a write fails at a flush), else PYTHONUNBUFFERED
    (at each print)."""
    files = {k: env.tmp / f"pipe.{k.lower()}" for k in ("ERR", "RC", "FIRST", "GONE")}
    for path in files.values():
        path.unlink(missing_ok=True)
    os.mkfifo(files["GONE"])
    subprocess.run(["/bin/bash", "-c", script, "bash", *command("jobq-ctl"),
                    "--sqlite-path", str(env.db), *args],
                   env={**{k: v for k, v in os.environ.items()
                           if not (buffered and k == "PYTHONUNBUFFERED")},
                        **{k: str(v) for k, v in files.items()},
                        **({} if buffered else {"PYTHONUNBUFFERED": "1"})},
                   cwd=env.tmp, timeout=60, check=True)
    first = files["FIRST"].read_text() if files["FIRST"].exists() else ""
    return int(files["RC"].read_text()), files["ERR"].read_text(), first


@pytest.fixture
def queue_with_history(env):
    """A queue with a succeeded and a failed task (their results recorded) and a pending
    one: every listing command has something to print."""
    ok, bad = env.push("echo hi", "exit 3", extra=("--max-attempts", "1"))
    sup = env.supervisor("--exit-when-empty")
    assert sup.wait(60) == 4  # a batch run in which a task failed
    env.push("echo later")
    return ok, bad


@pytest.mark.parametrize("args", [["status"], ["status", "--json"], ["peek"], ["failed"],
                                  ["failed", "--json"], ["workers", "--all"], ["size"],
                                  ["result", "OK"], ["result", "BAD", "--json"]],
                         ids=lambda a: "-".join(a).replace("--", ""))
def test_a_closed_stdout_ends_quietly_with_the_commands_status(env, queue_with_history, args):
    ok, bad = queue_with_history
    args = [{"OK": ok, "BAD": bad}.get(a, a) for a in args]
    rc, err, _ = _piped(env, CLOSED_FIRST, *args, buffered=True)
    assert (rc, err) == (0, ""), (rc, err)


@pytest.mark.parametrize("buffered", [True, False], ids=["buffered", "unbuffered"])
def test_push_many_into_head_pushes_all_and_exits_0(env, buffered):
    env.serve()  # else push warns on stderr: no worker has served the queue yet
    many = env.tmp / "many.txt"
    many.write_text("".join(f"echo {i}\n" for i in range(MANY)))
    rc, err, first = _piped(env, PLAIN, "push", "--file", str(many), buffered=buffered)
    assert (rc, err) == (0, ""), (rc, err)
    assert len(first.strip()) == 32  # the first id
    assert env.rows("SELECT COUNT(*) FROM jobs") == [(MANY,)]
    rc, err, _ = _piped(env, PLAIN, "peek", "-n", str(MANY), buffered=buffered)
    assert (rc, err) == (0, ""), (rc, err)


@pytest.mark.parametrize("buffered", [True, False], ids=["buffered", "unbuffered"])
def test_push_into_a_reader_gone_first_exits_0(env, buffered):
    env.serve()
    rc, err, _ = _piped(env, CLOSED_FIRST, "push", "-c", "true", "-c", "true",
                        buffered=buffered)
    assert (rc, err) == (0, ""), (rc, err)
    assert env.rows("SELECT COUNT(*) FROM jobs") == [(2,)]


@pytest.mark.parametrize("buffered", [True, False], ids=["buffered", "unbuffered"])
def test_push_wait_goes_on_waiting_without_a_reader_of_the_ids(env, buffered):
    """``push --wait``: the ids' reader gone, the wait is what is left to do; it exits by
    the tasks' outcome (here: succeeded)."""
    env.serve()  # the worker's own record may come after the push
    sup = env.supervisor("--idle-timeout", "30", "--poll-interval", "0.2")
    rc, err, _ = _piped(env, CLOSED_FIRST, "push", "-c", "true", "--wait", buffered=buffered)
    assert rc == 0, err
    assert err.strip().endswith(" succeeded") and len(err.splitlines()) == 1, err
    sup.signal(signal.SIGTERM)
    assert sup.wait(30) == 0
