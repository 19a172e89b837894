"""Acceptance 1, 3, 7, 9, 10: outcomes, retries, limits, bad input, logging."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import time

import psutil
import pytest

from tests.conftest import wait_for
from tests.integration.helpers import WORKER_SIGNALS, ignoring

pytestmark = pytest.mark.timeout(90)


def test_success_failure_retry_and_output_tail(env):
    ok, bad = env.push("echo hello-$JOBQ_ATTEMPT", "seq 1 10000; echo boom >&2; exit 7",
                       extra=("--max-attempts", "2"))
    sup = env.supervisor("--exit-when-empty", "--retry-delay", "0.2")
    assert sup.wait(60) == 4
    assert env.job(ok)["status"] == "succeeded"
    row = env.job(bad)
    assert (row["status"], row["attempt"], row["exit_status"]) == ("failed", 2, 7)
    assert "exit status 7" in row["reason"] and "attempt 2 of 2" in row["reason"]
    tail = row["output_tail"]
    assert tail.endswith("boom") and "9999" in tail and len(tail) <= 20 * 1024
    assert not tail.startswith("1\n")  # only the last ~20 KiB are kept
    log = sup.log()
    assert f"[{ok}]| hello-1" in log
    # the start is logged (on a spawner thread) before any line of the task's output
    assert log.index(f"[{ok}] started pid=") < log.index(f"[{ok}]| hello-1")
    assert log.index(f"[{bad}] started pid=") < log.index(f"[{bad}]| 1\n")
    assert "will retry" in log
    failed = env.ctl("failed", "--json").stdout
    [rec] = json.loads(failed)
    assert rec["id"] == bad and rec["attempts"] == 2 and "boom" in rec["output_tail"]


def test_attempts_are_counted_at_lease_time(env):
    """A task that takes its supervisor down with it still reaches its limit."""
    [tid] = env.push("kill -9 $PPID; sleep 5", extra=("--max-attempts", "2"))
    for attempt in (1, 2):
        # The first run's lease is taken back by the next supervisor: its owner is dead.
        sup = env.supervisor("--lock-duration", "3", "--renew-interval", "0.5",
                             "--reaper-interval", "0.2", "--stale-lock-age", "0")
        assert sup.wait(30) == -signal.SIGKILL
        row = env.job(tid)
        assert (row["attempt"], row["status"]) == (attempt, "running")
    # The second lease is never settled; its owner is dead: the next supervisor fails the job.
    sup = env.supervisor("--lock-duration", "3", "--reaper-interval", "0.2",
                         "--stale-lock-age", "0", "--idle-timeout", "5")
    wait_for(lambda: env.job(tid)["status"] == "failed", 30, what="failed by the reaper")
    assert "last attempt" in env.job(tid)["reason"]
    sup.wait_log(" started: ")  # it fails the job as it opens the database, before that
    sup.signal(signal.SIGTERM)
    assert sup.wait(30) == 0


def test_spawn_failure_is_a_failed_attempt(env):
    [tid] = env.push("true", extra=("--cwd", "/nonexistent/dir", "--max-attempts", "1"))
    sup = env.supervisor("--exit-when-empty")
    assert sup.wait(30) == 4
    row = env.job(tid)
    assert row["status"] == "failed" and "spawn failed" in row["reason"]
    assert "/nonexistent/dir" in row["reason"]


def test_task_environment(env, monkeypatch):
    out = env.tmp / "env.txt"
    env.push(f"env > {out}; pwd >> {out}", extra=("--env", "FOO=bar baz", "--cwd", "/tmp"))
    # --backend sqlite on the command line: the other backends' settings in the environment
    # (kept from the task below) do not choose a backend then (issue 41, core/backend_choice)
    sup = env.supervisor("--exit-when-empty", "--queue", "default", "--backend", "sqlite", env={
        "AZURE_STORAGE_CONNECTION_STRING": "DefaultEndpointsProtocol=x;AccountKey=SECRET1",
        "JOBQ_CONNECTION_STRING": "Endpoint=sb://x;SharedAccessKey=SECRET2",
        "MY_API_KEY": "SECRET3", "HARMLESS": "visible",
        # PostgreSQL's (issue 28): no word of these names says "secret"
        "JOBQ_POSTGRES_URL": "postgresql://u:SECRET4@db/jobs", "PGPASSWORD": "SECRET5",
        "PGPASSFILE": "/etc/SECRET6.pgpass", "PGHOST": "db.example"})
    assert sup.wait(30) == 0
    text = out.read_text()
    assert "SECRET" not in text
    assert "HARMLESS=visible" in text and "FOO=bar baz" in text and "PGHOST=db.example" in text
    assert "JOBQ_QUEUE_NAME=default" in text and "JOBQ_ATTEMPT=1" in text
    assert "PYTHONUNBUFFERED=1" in text and "JOBQ_TASK_ID=" in text
    assert text.strip().endswith("/tmp")


def test_plain_secret_names_are_kept_from_the_task(env):
    """Issue 26 (5): KEY, TOKEN, APIKEY, DB_PASS, GITHUB_PAT, AZURE_STORAGE_SAS passed the old
    suffix filter; --pass-env lets a named one through."""
    out = env.tmp / "env.txt"
    env.push(f"env > {out}")
    secrets = {name: f"SECRET{i}" for i, name in enumerate(
        ("KEY", "TOKEN", "APIKEY", "DB_PASS", "GITHUB_PAT", "AZURE_STORAGE_SAS", "HF_TOKEN"))}
    sup = env.supervisor("--exit-when-empty", "--pass-env", "HF_TOKEN", env={
        **secrets, "KEYBOARD": "kb", "PASSAGE": "ps"})
    assert sup.wait(30) == 0
    lines = out.read_text().splitlines()
    assert [line for line in lines if "SECRET" in line] == ["HF_TOKEN=SECRET6"]
    assert "KEYBOARD=kb" in lines and "PASSAGE=ps" in lines


def test_task_time_limit(env):
    [tid] = env.push("sleep 30", extra=("--max-attempts", "1"))
    sup = env.supervisor("--task-time-limit", "1", "--exit-when-empty", "--kill-timeout", "2")
    t0 = time.monotonic()
    assert sup.wait(30) == 4
    assert time.monotonic() - t0 < 20
    row = env.job(tid)
    assert row["status"] == "failed" and "time limit" in row["reason"]


def test_worker_time_limit_requeues_and_exits_0(env):
    [tid] = env.push("sleep 30")
    sup = env.supervisor("--time-limit", "2")
    assert sup.wait(30) == 0
    assert env.rows("SELECT status, attempt FROM jobs") == [("pending", 0)]
    assert "time limit" in sup.log()


def test_max_consecutive_failures_exits_3(env):
    env.push(*["exit 1"] * 4)
    sup = env.supervisor("--max-consecutive-failures", "2", "--retry-delay", "0")
    assert sup.wait(30) == 3
    assert "failed in a row" in sup.log()


def test_idle_timeout(env):
    sup = env.supervisor("--idle-timeout", "1", "--poll-interval", "0.2")
    assert sup.wait(30) == 0
    assert "idle" in sup.log()


def test_exit_when_empty_waits_for_a_retry(env):
    [tid] = env.push('[ "$JOBQ_ATTEMPT" = 2 ]')
    sup = env.supervisor("--exit-when-empty", "--retry-delay", "1.5", "--poll-interval", "0.2")
    assert sup.wait(30) == 0
    assert (env.job(tid)["status"], env.job(tid)["attempt"]) == ("succeeded", 2)


@pytest.mark.serial  # measures CPU seconds
def test_num_workers_runs_tasks_at_once_and_idles_without_cpu(env):
    marks = env.tmp / "marks"
    marks.mkdir()
    env.push(*[f"touch {marks}/$JOBQ_TASK_ID; sleep 2" for _ in range(3)])
    sup = env.supervisor("-n", "3", "--poll-interval", "1")
    wait_for(lambda: len(os.listdir(marks)) == 3, 10, what="3 tasks running at once")
    wait_for(lambda: env.rows("SELECT COUNT(*) FROM jobs WHERE status='succeeded'")[0][0] == 3,
             30, what="all done")
    proc = psutil.Process(sup.pid)
    before = sum(proc.cpu_times()[:2])
    time.sleep(3)  # the measuring window itself: idling is the absence of any event
    used = sum(proc.cpu_times()[:2]) - before
    assert used < 0.3, f"idle supervisor used {used:.2f} CPU-s in 3 s"
    sup.signal(signal.SIGTERM)
    assert sup.wait(30) == 0


def test_poison_body_is_failed_and_worker_continues(env):
    from supervisor.backends.sqlite.backend import SqliteBackend

    backend = SqliteBackend(str(env.db), "default", "test")
    backend.push_raw("{not json", "poison-1")
    backend.push_raw('{"version": 1, "kwargs": "{}", "id": "x"}', "poison-2")
    backend.close()
    [good] = env.push("echo fine")
    sup = env.supervisor("--exit-when-empty")
    assert sup.wait(30) == 4
    assert env.job("poison-1")["status"] == "failed"
    assert "not JSON" in env.job("poison-1")["reason"]
    assert "no command" in env.job("poison-2")["reason"]
    assert env.job(good)["status"] == "succeeded"


@pytest.mark.parametrize("args,needle", [
    (["--bogus"], "unrecognized arguments"),
    (["--num-workers", "x"], "--num-workers"),
    (["--lock-duration", "5 minutes"], "--lock-duration"),
    (["--renew-interval", "10", "--lock-duration", "6"], "--renew-interval"),
    (["--backend", "nosuch"], "--backend"),
    (["--log-format", "xml"], "--log-format"),
    (["--config", "/nonexistent.ini"], "nonexistent.ini"),
])
def test_bad_options_exit_2_with_one_line(env, args, needle):
    sup = env.supervisor(*args)
    assert sup.wait(30) == 2
    out = sup.log().strip()
    assert len(out.splitlines()) == 1, out
    assert needle in out and "Traceback" not in out


def test_unreadable_config_and_bad_values_in_config(env):
    cfg = env.tmp / "w.ini"
    cfg.write_text("[jobq-supervisor]\nkill-timeout = soon\n")
    sup = env.supervisor("--config", str(cfg))
    assert sup.wait(30) == 2
    # the file, line and key, not the "--kill-timeout=soon" configargparse makes of it
    assert f"{cfg} line 2: kill-timeout: invalid duration 'soon'" in sup.log()
    assert len(sup.log().strip().splitlines()) == 1
    for unreadable in (env.tmp, env.tmp / "latin1.ini"):  # a directory; not UTF-8 text
        (env.tmp / "latin1.ini").write_bytes(b"\xff\xfe num-workers = 2\n")
        sup = env.supervisor("--config", str(unreadable))
        assert sup.wait(30) == 2
        out = sup.log().strip()
        assert len(out.splitlines()) == 1 and "config" in out and "Traceback" not in out, out
    if os.geteuid() != 0:  # root reads any file
        cfg.chmod(0)
        sup = env.supervisor("--config", str(cfg))
        assert sup.wait(30) == 2


def test_not_a_database_exit_2(env):
    bogus = env.tmp / "notes.txt"
    bogus.write_text("this is not a database\n" * 100)
    sup = env.supervisor("--sqlite-path", str(bogus))
    assert sup.wait(30) == 2
    out = sup.log().strip()
    assert len(out.splitlines()) == 1 and "not a usable SQLite database" in out
    res = env.ctl("--sqlite-path", str(bogus), "size", check=False)
    assert res.returncode == 2 and "not a usable SQLite database" in res.stderr


def test_json_log_format_and_lifecycle_events(env):
    [tid] = env.push("echo out-line; exit 0")
    sup = env.supervisor("--exit-when-empty", "--log-format", "json", "--log-level", "DEBUG",
                         "--lock-duration", "3", "--renew-interval", "0.5")
    assert sup.wait(30) == 0
    records = [json.loads(line) for line in sup.log().splitlines() if line.strip()]
    mine = [r for r in records if r.get("task_id") == tid]
    messages = " | ".join(r["message"] for r in mine)
    for needle in ("received task (attempt 1 of", "started pid=", "(attempt 1 of 5): echo out-line",
                   "out-line", "finished: exit status 0"):
        assert needle in messages
    started = next(r for r in mine if r["message"].startswith("started"))
    assert started["pid"] > 0
    finished = next(r for r in mine if r["message"].startswith("finished"))
    assert finished["exit_status"] == 0 and "duration" in finished


def test_renewal_logged_at_debug(env):
    env.push("sleep 2")
    sup = env.supervisor("--exit-when-empty", "--log-level", "DEBUG", "--lock-duration", "3",
                         "--renew-interval", "0.5")
    assert sup.wait(30) == 0
    assert "Lock renewed till" in sup.log()


def test_ctl_commands(env):
    ids = env.push("echo a", "echo b", "echo c")
    assert env.ctl("size").stdout.strip() == "3"
    peek = json.loads(env.ctl("peek", "-n", "2", "--json").stdout)
    assert [p["id"] for p in peek] == ids[:2]
    st = json.loads(env.ctl("status", "--json").stdout)
    assert st["counts"]["pending"] == 3
    res = env.ctl("push", "--file", "-", input="echo d\n# comment\n\necho e\n")
    assert len(res.stdout.split()) == 2
    assert env.ctl("clear").stdout.strip() == "deleted 5"
    [f] = env.push("exit 1", extra=("--max-attempts", "1"))
    sup = env.supervisor("--exit-when-empty")
    assert sup.wait(30) == 4
    assert f in env.ctl("failed").stdout
    assert env.ctl("requeue", "--all-failed").stdout.strip() == "requeued 1"
    assert env.ctl("size").stdout.strip() == "1"
    bad = env.ctl("requeue", check=False)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1
    # a running task shows up in status with its worker
    env.ctl("clear")
    env.push("sleep 30")
    sup = env.supervisor("--worker-id", "w-test")
    wait_for(lambda: "w-test" in env.ctl("status").stdout, 20, what="running task in status")
    sup.signal(signal.SIGTERM)
    assert sup.wait(30) == 0


def test_ctl_busy_database_waits_instead_of_failing(env):
    env.push("true")
    conn = sqlite3.connect(env.db, isolation_level=None)
    conn.execute("BEGIN IMMEDIATE")
    try:
        import subprocess

        from tests.conftest import command
        proc = subprocess.Popen(command("jobq-ctl") + ["--sqlite-path", str(env.db), "push",
                                                       "-c", "true"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        db = os.path.realpath(env.db)
        wait_for(lambda: proc.poll() is not None or db in _open_files(proc.pid), 30,
                 what="jobq-ctl to open the database")
        # It has reached the locked database: a short busy timeout (the worker's is 0.5 s)
        # would fail within this window.  Waiting on a lock shows no event: a fixed window.
        with pytest.raises(subprocess.TimeoutExpired):
            proc.wait(1.5)
    finally:
        conn.execute("ROLLBACK")
        conn.close()
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err


def _open_files(pid: int) -> set[str]:
    try:
        return {f.path for f in psutil.Process(pid).open_files()}
    except psutil.Error:  # gone, or a zombie
        return set()


# Starts the command after it with every signal the worker handles ignored, as nohup (SIGHUP)
# and a shell's background job (`cmd &`: SIGINT, SIGQUIT) leave some of them.
IGNORING = ignoring(*(s for s in WORKER_SIGNALS if s not in (signal.SIGPIPE, signal.SIGXFSZ)))


@pytest.mark.parametrize("prefix", [(), IGNORING], ids=["plain-start", "started-ignoring"])
def test_tasks_start_with_no_signal_blocked_or_ignored(env, tmp_path, prefix):
    """Both ways of starting a shell (posix_spawn; Popen when the task has a cwd): the
    supervisor's threads block its signals and Python ignores SIGPIPE, the task must inherit
    neither (`yes | head` must end by SIGPIPE, a task must be able to get SIGTERM) -- nor
    any signal the supervisor handles or ignores (SIGHUP, SIGUSR2, ..., real-time ones),
    whatever its own parent left ignored (nohup, a background job).
    Probed in a program the task runs (grep), not in bash: bash ignores SIGQUIT itself and
    gives its programs the dispositions it got."""
    out = tmp_path / "masks"

    def probe(tag: str) -> str:
        return (f"grep -E '^Sig(Blk|Ign)' /proc/self/status > {out}.{tag}; "
                f"yes | head -1 > /dev/null; echo ${{PIPESTATUS[0]}} > {out}.{tag}.pipe")

    env.push(probe("plain"))
    env.push(probe("cwd"), extra=("--cwd", str(tmp_path)))
    sup = env.supervisor("--exit-when-empty", prefix=prefix)
    assert sup.wait(60) == 0, sup.log()[-2000:]
    ours = set(WORKER_SIGNALS)
    for tag in ("plain", "cwd"):
        masks = dict(line.split(":") for line in (tmp_path / f"masks.{tag}").read_text()
                     .splitlines())
        for name in ("SigBlk", "SigIgn"):
            bits = int(masks[name], 16)
            assert not [s for s in ours if bits & (1 << (s - 1))], (tag, masks)
        # yes died of SIGPIPE (128+13), not of a write error with SIGPIPE ignored (exit 1)
        assert (tmp_path / f"masks.{tag}.pipe").read_text().split() == ["141"], tag
