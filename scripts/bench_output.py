"""How fast one supervisor logs its tasks' output, next to ``cat`` of the same output.

One task prints ``LINES`` lines of 100 characters as fast as ``tr``/``fold`` make them; the
supervisor logs what its writer keeps up with and drops the rest with a counted marker
(``supervisor/logs.py``), so the lines it logged per second of the task's run are its writer's
sustained rate under a flood.  Its log goes into a file, then into a pipe read by
``cat >/dev/null``; the reference is the same command piped through ``cat`` into a file and
into ``cat >/dev/null``, in the same run.  Log lines count in MB/s at their full length
(timestamp, level, task id); the pipe case, whose bytes nobody counts, is credited the file
case's bytes per line.  Run alone: ``.venv/bin/python scripts/bench_output.py [LINES]``.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchlib import ACCOUNT_KEY, REPO, expect_exit, free_port, supervisor, wait_until

LINES = 1_000_000
WIDTH = 100


def _command(lines: int) -> str:
    return f"head -c {lines * WIDTH} /dev/zero | tr '\\0' x | fold -w {WIDTH}"


def _supervise(bin_dir: Path, tmp: Path, lines: int, to_pipe: bool) -> tuple[int, int, float]:
    """Run one supervisor on one task; its logged output lines, log bytes (file case) and
    the seconds from the task's start to the supervisor's exit."""
    db, start = tmp / "q.db", tmp / "t0"
    db.unlink(missing_ok=True)
    subprocess.run([str(bin_dir / "jobq-ctl"), "--sqlite-path", str(db), "push", "-c",
                    f"date +%s.%N > {start}; {_command(lines)}"], check=True, capture_output=True)
    metrics, log = tmp / "m.prom", tmp / "sup.log"
    args = [str(bin_dir / "jobq-supervisor"), "--sqlite-path", str(db), "--exit-when-empty",
            "--metrics-file", str(metrics)]
    if to_pipe:
        cat = subprocess.Popen(["cat"], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)
        assert cat.stdin is not None
        sup = subprocess.run(args, stderr=cat.stdin, stdout=subprocess.DEVNULL, cwd=tmp,
                             timeout=600)
        end = time.time()
        cat.stdin.close()
        cat.wait(60)
        size = 0
    else:
        with open(log, "wb") as out:
            sup = subprocess.run(args, stderr=out, stdout=subprocess.DEVNULL, cwd=tmp,
                                 timeout=600)
        end = time.time()
        size = log.stat().st_size
    if sup.returncode != 0:
        raise RuntimeError(f"supervisor exited {sup.returncode}")
    found = re.search(r"^jobq_task_output_lines_dropped_total\{.*\} (\S+)$",
                      metrics.read_text(), re.M)
    dropped = int(float(found.group(1))) if found else 0
    return lines - dropped, size, end - float(start.read_text())


def _cat(cmd: str, tail: str) -> float:
    began = time.monotonic()
    subprocess.run(["sh", "-c", f"{cmd} | {tail}"], check=True, timeout=600)
    return time.monotonic() - began


def output_rate(python: str, workdir: Path, lines: int = LINES) -> dict[str, float]:
    """Lines/s and MB/s one supervisor logs into a file and into a pipe, and ``cat``'s in the
    same run (the caller's thread; ``python`` is the interpreter whose bin directory holds
    jobq-supervisor and jobq-ctl; scratch files go under ``workdir``)."""
    bin_dir = Path(python).parent
    cmd = _command(lines)
    out: dict[str, float] = {"output_lines": lines}
    with tempfile.TemporaryDirectory(dir=workdir) as name:
        tmp = Path(name)
        logged, size, secs = _supervise(bin_dir, tmp, lines, to_pipe=False)
        per_line = size / max(logged, 1)
        out.update(supervisor_file_lines_per_s=logged / secs,
                   supervisor_file_mb_per_s=size / secs / 1e6,
                   supervisor_file_logged_fraction=logged / lines)
        logged, _size, secs = _supervise(bin_dir, tmp, lines, to_pipe=True)
        out.update(supervisor_pipe_lines_per_s=logged / secs,
                   supervisor_pipe_mb_per_s=logged * per_line / secs / 1e6,
                   supervisor_pipe_logged_fraction=logged / lines)
        raw_mb = lines * (WIDTH + 1) / 1e6
        secs = _cat(cmd, f"cat > {tmp / 'cat.out'}")
        out.update(cat_file_lines_per_s=lines / secs, cat_file_mb_per_s=raw_mb / secs)
        secs = _cat(cmd, "cat | cat > /dev/null")
        out.update(cat_pipe_lines_per_s=lines / secs, cat_pipe_mb_per_s=raw_mb / secs)
    return out


def store_rate(python: str, workdir: Path, megabytes: int) -> dict[str, float]:
    """MB/s one supervisor stores of one task's output into the SQLite queue's output store
    (files beside the database), from the task's start until its attempt is complete there,
    and ``cat`` of the same output into a file in the same run (the caller's thread)."""
    bin_dir = Path(python).parent
    lines = megabytes * 1_000_000 // (WIDTH + 1)
    cmd = _command(lines)
    with tempfile.TemporaryDirectory(dir=workdir) as name:
        tmp = Path(name)
        db, start = tmp / "q.db", tmp / "t0"
        subprocess.run([str(bin_dir / "jobq-ctl"), "--sqlite-path", str(db), "push", "-c",
                        f"date +%s.%N > {start}; {cmd}"], check=True, capture_output=True)
        with open(tmp / "sup.log", "wb") as out:
            sup = subprocess.run(
                [str(bin_dir / "jobq-supervisor"), "--sqlite-path", str(db), "--exit-when-empty",
                 "--task-output", "store", "--task-output-max", f"{megabytes * 2}M"],
                stderr=out, stdout=subprocess.DEVNULL, cwd=tmp, timeout=600)
        if sup.returncode != 0:
            raise RuntimeError(f"supervisor exited {sup.returncode}")
        logs = list((tmp / "q.db.output").rglob("1.log"))
        done = logs[0].with_suffix(".done")
        stored = logs[0].stat().st_size
        secs = done.stat().st_mtime - float(start.read_text())
        raw_secs = _cat(cmd, f"cat > {tmp / 'cat.out'}")
    raw_mb = lines * (WIDTH + 1) / 1e6
    return {"store_mb": raw_mb, "store_stored_fraction": stored / (lines * (WIDTH + 1)),
            "store_mb_per_s": stored / secs / 1e6, "cat_file_mb_per_s": raw_mb / raw_secs}


def _azurite_all(cwd: Path) -> tuple[subprocess.Popen[bytes], str]:
    """Azurite's queue, table and blob services (one process, in memory) on free loopback
    ports, and a connection string naming all three."""
    queue_bin = os.environ.get("AZURITE_QUEUE_BIN")
    binary = (Path(queue_bin).parent if queue_bin
              else REPO / ".azurite" / "node_modules" / ".bin") / "azurite"
    ports = {service: free_port() for service in ("blob", "queue", "table")}
    args = [str(binary), "--inMemoryPersistence", "--skipApiVersionCheck", "--disableTelemetry",
            "--silent"]
    for service, port in ports.items():
        args += [f"--{service}Host", "127.0.0.1", f"--{service}Port", str(port)]
    proc = subprocess.Popen(args, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)

    def up() -> bool:
        return all(_accepts(port) for port in ports.values())

    try:
        wait_until(up, 30, 0.1, what=f"Azurite ({binary}) to listen")
    except BaseException:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
        raise
    conn = f"DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey={ACCOUNT_KEY}"
    for service, port in ports.items():
        conn += f";{service.capitalize()}Endpoint=http://127.0.0.1:{port}/devstoreaccount1"
    return proc, conn


def _accepts(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def blob_store_rate(python: str, workdir: Path, megabytes: int) -> dict[str, float]:
    """MB/s one Storage Queue worker stores of one task's output into the Azure output store
    (append blobs, container jobq-logs) on Azurite -- queue, control store (table) and blob
    all on loopback -- from the task's start until its attempt is complete there (polled
    every 0.25 s), and ``cat`` of the same output into a file (the caller's thread)."""
    from azure.storage.blob import ContainerClient

    from supervisor.backends.storage_queue.backend import StorageQueueBackend
    from supervisor.core.task import Task

    bin_dir = Path(python).parent
    lines = megabytes * 1_000_000 // (WIDTH + 1)
    cmd = _command(lines)
    queue = "benchout"
    with tempfile.TemporaryDirectory(dir=workdir) as name:
        tmp = Path(name)
        start = tmp / "t0"
        azurite, conn = _azurite_all(tmp)
        try:
            backend = StorageQueueBackend(queue, connection_string=conn, worker_id="bench")
            backend.push([Task(cmd=f"date +%s.%N > {start}; {cmd}")])
            backend.close()
            logs = ContainerClient.from_connection_string(conn, container_name="jobq-logs")
            args = ["--backend", "storage-queue", "--queue", queue, "--exit-when-empty",
                    "--poll-interval", "0.05", "--task-output", "store",
                    "--task-output-max", f"{megabytes * 2}M"]
            parts: list = []

            def complete() -> bool:
                nonlocal parts
                try:
                    parts = list(logs.list_blobs(name_starts_with=f"{queue}/",
                                                 include=["metadata"]))
                except Exception:  # noqa: BLE001 - no container yet
                    parts = []
                return any((p.metadata or {}).get("complete") == "1" for p in parts)

            with supervisor(args, tmp, env={"JOBQ_CONNECTION_STRING": conn},
                            prog=[str(bin_dir / "jobq-supervisor")]) as sup:
                # stopped by supervisor() however this ends: a timeout raises BenchError
                wait_until(complete, 600, 0.25, what="the attempt complete in the blob store")
                done_at = time.time()
                expect_exit(sup, 60, tmp / "sup.log")
            logs.close()
            stored = sum(p.size for p in parts)
            secs = done_at - float(start.read_text())
        finally:
            os.killpg(azurite.pid, signal.SIGKILL)
            azurite.wait(10)
        raw_secs = _cat(cmd, f"cat > {tmp / 'cat.out'}")
    raw_mb = lines * (WIDTH + 1) / 1e6
    return {"blob_mb": raw_mb, "blob_stored_fraction": stored / (lines * (WIDTH + 1)),
            "blob_mb_per_s": stored / secs / 1e6, "cat_file_mb_per_s": raw_mb / raw_secs}


def main() -> int:
    lines = int(sys.argv[1]) if len(sys.argv) > 1 else LINES
    result = output_rate(sys.executable, Path(tempfile.gettempdir()), lines)
    print(json.dumps({k: round(v, 3) for k, v in result.items()}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
