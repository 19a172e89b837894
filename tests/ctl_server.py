"""A fork server ("zygote") for the tests' run-to-completion ``jobq-ctl`` calls.

Why: the parallel test phase is CPU-bound, and each of its >1000 ``jobq-ctl`` processes spent
~0.11-0.16 CPU-s starting Python and importing the ctl, its stores and their SDKs (issue 27:
the suite in under 10 minutes on 2 cores).  ``run`` gives what ``subprocess.run(cmd,
capture_output=True, text=True, ...)`` gives, from a command forked off a server of this
pytest process that imported all that once: on the caller's pipes, in its cwd, with exactly
its environment, ``sys.exit(ctl_entry())`` as the console script, the interpreter's exit path.

The server (``python -c``, its own session, started on first use) serves on a Unix socket in
a private temp dir; per request a handler forks the command and sends back its status
(negative: the signal that killed it); a timeout kills the command.  The server ends when
``stop`` (session end) or the death of the pytest process closes the pipe it reads.
``run`` falls back to the real ``subprocess.run`` when the server cannot start, ``cmd[0]`` is
not the venv's console script, the start-up variables (PYTHON*, LC_*, LANG) differ from the
server's, or JOBQ_TEST_CTL_FORK=0.  Tests of the real process (start-up, imports, signals to
a running ``jobq-ctl``) use the console script.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import json
import locale
import os
import select
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, NoReturn

BIN = Path(sys.executable).parent
SCRIPT = str(BIN / "jobq-ctl")
_BOOT = "from tests.ctl_server import serve, execute; execute(serve())"


def _startup_vars(env: dict[str, str]) -> dict[str, str]:
    """What a Python reads when it starts (the server read its own once)."""
    return {k: v for k, v in env.items() if k.startswith(("PYTHON", "LC_")) or k == "LANG"}


class _Server:
    """The client's handle on this pytest process's server (any thread, under _lock)."""

    def __init__(self) -> None:
        self.owner = os.getpid()
        self.dir = tempfile.mkdtemp(prefix="jobq-ctl-server-")
        self.path = os.path.join(self.dir, "socket")
        self.env = dict(os.environ)
        life_r, self.life_w = os.pipe()  # only we hold the write end: its EOF ends the server
        ready_r, ready_w = os.pipe()
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _BOOT, self.path, str(life_r), str(ready_w)],
            pass_fds=[life_r, ready_w], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, start_new_session=True, env=self.env,
            cwd=Path(__file__).resolve().parent.parent)
        os.close(life_r)
        os.close(ready_w)
        with open(ready_r, "rb") as ready:  # "ready", or EOF when it failed to start
            ok = bool(select.select([ready], [], [], 60)[0]) and ready.read(5) == b"ready"
        if not ok:
            self.stop()
            raise OSError("jobq-ctl fork server did not start")

    def stop(self) -> None:
        os.close(self.life_w)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


_lock = threading.Lock()
_server: _Server | None = None
_failed = False


def _get() -> _Server | None:
    global _server, _failed
    with _lock:
        if _server is not None and _server.owner != os.getpid():  # a fork of pytest
            return None
        if _server is None and not _failed and os.environ.get("JOBQ_TEST_CTL_FORK") != "0":
            try:
                _server = _Server()
            except OSError:
                _failed = True
        return _server


def stop() -> None:
    """End this pytest process's server, if it started one (session end)."""
    global _server
    with _lock:
        if _server is not None and _server.owner == os.getpid():
            _server.stop()
        _server = None


def run(cmd: list[str], *, input: str | None = None, env: dict[str, str] | None = None,
        cwd: str | os.PathLike[str] | None = None,
        timeout: float | None = None) -> subprocess.CompletedProcess[str]:
    """``subprocess.run(cmd, capture_output=True, text=True, ...)`` for a jobq-ctl that runs
    to completion, forked from the server when it can be (caller's thread)."""
    env = dict(os.environ) if env is None else dict(env)
    server = _get() if cmd and cmd[0] == SCRIPT else None
    sock = None
    if (server is not None and _startup_vars(env) == _startup_vars(server.env)
            and (cwd is None or os.path.isdir(cwd))):
        encoding = "utf-8" if sys.flags.utf8_mode else locale.getencoding()
        request = json.dumps({"argv": cmd, "env": env, "cwd": os.path.abspath(cwd or ".")})
        pipes = [os.pipe(), os.pipe()]
        stdin = 0  # with no input, subprocess lets the command inherit our stdin
        if input is not None:  # a file, not a pipe: nothing to feed while we read
            stdin = os.memfd_create("jobq-ctl-stdin")
            os.write(stdin, input.encode(encoding))
            os.lseek(stdin, 0, os.SEEK_SET)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            sock.connect(server.path)
            socket.send_fds(sock, [request.encode()], [stdin, pipes[0][1], pipes[1][1]])
        except OSError:  # the server is gone: the real thing
            sock.close()
            sock = None
            os.close(pipes[0][0])
            os.close(pipes[1][0])
        for fd in (stdin, pipes[0][1], pipes[1][1]) if stdin else (pipes[0][1], pipes[1][1]):
            os.close(fd)
    if sock is None:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                              input=input, env=env, cwd=cwd)
    out, err, status, timed_out = _collect(sock, pipes[0][0], pipes[1][0], timeout)
    if timed_out:
        raise subprocess.TimeoutExpired(cmd, timeout or 0, output=out or None,
                                        stderr=err or None)
    if status is None:
        raise OSError(f"jobq-ctl fork server lost the command {cmd}")
    return subprocess.CompletedProcess(cmd, status, _text(out, encoding), _text(err, encoding))


def _collect(sock: socket.socket, out: int, err: int,
             timeout: float | None) -> tuple[bytes, bytes, int | None, bool]:
    """The command's stdout and stderr to their ends, and its status; past ``timeout`` the
    handler kills it first (caller's thread)."""
    data = {out: bytearray(), err: bytearray()}
    deadline = None if timeout is None else time.monotonic() + timeout
    status, timed_out = None, False
    with sock, selectors.DefaultSelector() as sel:
        for fd in (out, err, sock.fileno()):
            sel.register(fd, selectors.EVENT_READ)
        while sel.get_map():
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                timed_out, deadline = True, None
                with contextlib.suppress(OSError):  # it ended just now
                    sock.send(b"kill")  # the handler kills the command, then says so
            for key, _ in sel.select(left if left is None else max(left, 0)):
                if key.fd == sock.fileno():
                    try:
                        msg = sock.recv(64)  # the status, then EOF: the handler is gone
                    except ConnectionResetError:  # gone as our "kill" came
                        msg = b""
                    status = int(msg) if msg else status
                else:
                    msg = os.read(key.fd, 65536)
                    data[key.fd] += msg
                if not msg:
                    sel.unregister(key.fd)
                    if key.fd != sock.fileno():
                        os.close(key.fd)
    return bytes(data[out]), bytes(data[err]), status, timed_out


def _text(data: bytes, encoding: str) -> str:
    return data.decode(encoding).replace("\r\n", "\n").replace("\r", "\n")


# ---- the server side (its main thread; the only thread it has) ----

def _preload() -> None:
    """Import what jobq-ctl's commands import lazily (not the dashboard: a Popen)."""
    import importlib
    import pkgutil

    import supervisor

    for mod in pkgutil.walk_packages(supervisor.__path__, "supervisor."):
        if not mod.name.startswith("supervisor.dashboard"):
            importlib.import_module(mod.name)
    for name in ("azure.identity", "azure.core.rest._requests_basic"):  # imported on use
        with contextlib.suppress(ImportError):
            importlib.import_module(name)


def serve() -> dict[str, Any]:
    """The server's loop.  It returns only in a forked command, its request."""
    path, life, ready = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    _preload()
    gc.freeze()  # the commands' collections then leave the server's pages unshared
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(path)
    listener.listen(64)
    os.write(ready, b"ready")
    os.close(ready)
    handlers: dict[int, int] = {}  # pidfd -> pid
    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ)
    sel.register(life, selectors.EVENT_READ)
    while True:
        for key, _ in sel.select():
            if key.fileobj is listener:
                conn, _ = listener.accept()
                pid = os.fork()
                if pid == 0:
                    sel.close()
                    listener.close()
                    for fd in (life, *handlers):
                        os.close(fd)
                    return _handle(conn)
                conn.close()
                pidfd = os.pidfd_open(pid)
                handlers[pidfd] = pid
                sel.register(pidfd, selectors.EVENT_READ)
            elif key.fd == life:  # pytest's stop, or its death
                listener.close()
                os.unlink(path)
                os.rmdir(os.path.dirname(path))
                for pid in handlers.values():  # each ends once its caller is gone
                    os.waitpid(pid, 0)
                os._exit(0)
            else:
                sel.unregister(key.fd)
                os.waitpid(handlers.pop(key.fd), 0)
                os.close(key.fd)


def _handle(conn: socket.socket) -> dict[str, Any]:
    """A handler: fork the command, send its status back (returns only in the command)."""
    try:
        msg, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
        pid = os.fork()
        if pid == 0:
            conn.close()
            return {**json.loads(msg), "fds": fds}
        for fd in fds:
            os.close(fd)
        with selectors.DefaultSelector() as sel:
            pidfd = os.pidfd_open(pid)
            sel.register(pidfd, selectors.EVENT_READ)
            sel.register(conn, selectors.EVENT_READ)
            if any(key.fileobj is conn for key, _ in sel.select()):  # timeout, or caller gone
                conn.recv(64)  # read, or our exit would reset the connection
                os.kill(pid, signal.SIGKILL)
        status = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
        conn.send(str(status).encode())
    except BaseException:  # noqa: BLE001 -- a handler never returns into the server's loop
        os._exit(1)
    os._exit(0)


def become(request: dict[str, Any]) -> None:
    """In the forked command: what exec would have given a fresh ``jobq-ctl``."""
    for target, fd in enumerate(request["fds"]):
        os.dup2(fd, target)
    os.closerange(3, os.sysconf("SC_OPEN_MAX"))  # subprocess's close_fds
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    time.tzset()
    python: dict[int, Any] = {signal.SIGINT: signal.default_int_handler,  # as a fresh
                              signal.SIGPIPE: signal.SIG_IGN, signal.SIGXFSZ: signal.SIG_IGN}
    for signum in signal.valid_signals():
        if signum not in (signal.SIGKILL, signal.SIGSTOP):
            try:
                signal.signal(signum, python.get(signum, signal.SIG_DFL))
            except (OSError, ValueError):
                pass  # signals Python may not set
    signal.pthread_sigmask(signal.SIG_SETMASK, set())
    sys.argv = [SCRIPT, *request["argv"][1:]]
    sys.path[0] = str(BIN)


def execute(request: dict[str, Any]) -> NoReturn:
    """In the forked command: ``sys.exit(ctl_entry())`` as the console script does, and the
    interpreter's exit after it -- threads joined, atexit, streams flushed (120 when stdout
    cannot be), a KeyboardInterrupt's SIGINT -- but not the teardown of every module the
    server imported (~0.1 CPU-s): os._exit instead."""
    become(request)
    from supervisor.ctl.main import ctl_entry

    interrupted = False
    try:
        try:
            sys.exit(ctl_entry())
        except SystemExit as exc:
            if exc.code is None or isinstance(exc.code, int):
                status = (exc.code or 0) & 0xFF
            else:
                print(exc.code, file=sys.stderr)
                status = 1
    except BaseException as exc:  # noqa: BLE001 -- what the interpreter does with it
        sys.excepthook(type(exc), exc, exc.__traceback__)
        interrupted, status = isinstance(exc, KeyboardInterrupt), 1
    try:
        threading._shutdown()  # type: ignore[attr-defined]  # waits for non-daemon threads, as at exit
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception as exc:  # noqa: BLE001 -- reported as the interpreter does
                if stream is sys.stdout:
                    status = 120
                    print(f"Exception ignored in: {stream!r}\n{exc!r}", file=sys.stderr)
        if interrupted:
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)
        os._exit(status)

