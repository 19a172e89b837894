"""Tasks that cannot run are failed at once, on a real worker (issue 25, class 7): a command
not found or not executable, a --cwd that does not exist; ``push --cwd`` takes only an
absolute directory."""

from __future__ import annotations

import json

import pytest

from tests.integration.helpers import one_usage_line

pytestmark = pytest.mark.timeout(90)


def test_command_not_found_and_missing_cwd_fail_on_their_first_attempt(env):
    script = env.tmp / "not-executable.sh"
    script.write_text("echo hi\n")
    missing, noexec, gone, ok = (
        env.push("no-such-command-jobq-25")[0], env.push(str(script))[0],
        env.push("true", extra=("--cwd", str(env.tmp / "gone")))[0], env.push("true")[0])
    # --retry-delay 0: without the fix each would be retried at once, up to 5 attempts
    sup = env.supervisor("--exit-when-empty", "--retry-delay", "0")
    assert sup.wait(60) == 4  # a batch run with failed tasks
    for tid, why in ((missing, "exit status 127: command not found, not retried"),
                     (noexec, "exit status 126: command cannot execute, not retried"),
                     (gone, "spawn failed: No such file or directory (cwd "
                            f"{env.tmp / 'gone'}): the task cannot start, not retried")):
        row = env.job(tid)
        assert (row["status"], row["attempt"]) == ("failed", 1), row
        assert row["reason"].startswith(why) and row["reason"].endswith("attempt 1 of 5"), row
    assert env.job(ok)["status"] == "succeeded"
    assert "will retry" not in sup.log()
    assert "command not found" in env.job(missing)["output_tail"]
    [rec] = [r for r in json.loads(env.ctl("failed", "--json").stdout) if r["id"] == missing]
    assert rec["attempts"] == 1 and rec["exit_status"] == 127


@pytest.mark.parametrize("how", ["flag", "env", "ini"])
def test_the_set_of_statuses_not_retried_is_configurable(env, how):
    """``exit 3`` is final once listed; an empty list retries even 127."""
    three, missing = env.push("exit 3")[0], env.push("no-such-command-jobq-25")[0]
    args = ["--exit-when-empty", "--retry-delay", "0", "--max-attempts", "2"]
    extra_env = None
    if how == "flag":
        args += ["--no-retry-exit-codes", "3"]
    elif how == "env":
        extra_env = {"JOBQ_NO_RETRY_EXIT_CODES": "3"}
    else:
        ini = env.tmp / "worker.ini"
        ini.write_text("no-retry-exit-codes = 3\n")
        args += ["--config", str(ini)]
    assert env.supervisor(*args, env=extra_env).wait(60) == 4
    assert (env.job(three)["attempt"], env.job(missing)["attempt"]) == (1, 2)
    assert "exit status 3: not retried (--no-retry-exit-codes)" in env.job(three)["reason"]


def test_empty_list_retries_every_status(env):
    [missing] = env.push("no-such-command-jobq-25")
    sup = env.supervisor("--exit-when-empty", "--retry-delay", "0", "--max-attempts", "2",
                         "--no-retry-exit-codes", "")
    assert sup.wait(60) == 4
    row = env.job(missing)
    assert row["attempt"] == 2 and "giving up" in row["reason"]


def test_bad_no_retry_exit_codes_is_one_line_exit_2(env):
    sup = env.supervisor("--no-retry-exit-codes", "0")
    assert sup.wait(30) == 2
    lines = sup.log().splitlines()
    assert len(lines) == 1 and "--no-retry-exit-codes: 0 is not an exit status" in lines[0]


def test_push_refuses_a_relative_cwd(env):
    res = env.ctl("push", "-c", "true", "--cwd", "relative/dir", check=False)
    line = one_usage_line(res, "--cwd")
    assert "absolute" in line and "relative/dir" in line
    assert env.rows("SELECT COUNT(*) FROM jobs") == [(0,)]
