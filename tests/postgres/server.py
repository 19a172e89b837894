"""A real PostgreSQL server for the tests: initdb into a temporary folder, a free loopback TCP
port, its unix socket in that folder, killed and removed when closed.

Debian's ``postgresql`` package (scripts/test installs it where ``initdb`` is missing).
PostgreSQL refuses to run as root, and CI runs as root: then initdb and pg_ctl run as the
``postgres`` user (``runuser -u postgres --``) and the folder belongs to that user.  The folder
is made with ``tempfile.mkdtemp`` (under /tmp), not in pytest's tmp_path: that one is private
to root, and the postgres user could not reach it.

Clients connect over TCP with a password (scram-sha-256), so that tests can get a password
wrong and a TCP proxy can sit between a worker and the server; the unix socket trusts local
users (the tests' own admin connections, psql).
"""

from __future__ import annotations

import glob
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from pathlib import Path
from urllib.parse import quote

import psutil

SUPERUSER = "postgres"
PASSWORD = "pg-test-s3cret"  # the superuser's; tests assert it never shows in output
START_WITHIN = 60.0  # s: pg_ctl -w waits this long for the server to accept connections


def find_bindir() -> str | None:
    """The newest /usr/lib/postgresql/*/bin with initdb, else ``pg_config --bindir``'s; None
    when PostgreSQL's server binaries are not installed."""
    def version(path: str) -> float:
        try:
            return float(Path(path).parent.name)
        except ValueError:
            return 0.0

    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"),
                   key=lambda p: version(str(Path(p).parent)), reverse=True)
    if found:
        return str(Path(found[0]).parent)
    try:
        bindir = subprocess.run(["pg_config", "--bindir"], capture_output=True, text=True,
                                timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return bindir if bindir and os.access(Path(bindir) / "initdb", os.X_OK) else None


def why_no_server() -> str | None:
    """Why the PostgreSQL tests cannot run here (one line), or None."""
    if find_bindir() is None:
        return ("PostgreSQL is not installed (no initdb in /usr/lib/postgresql/*/bin nor "
                "pg_config --bindir; apt-get install postgresql, as scripts/test does)")
    if os.geteuid() == 0:
        try:
            import pwd

            pwd.getpwnam(SUPERUSER)
        except KeyError:
            return "running as root and there is no postgres user to run the server as"
    try:
        import psycopg  # noqa: F401
        import psycopg_pool  # noqa: F401
    except ImportError:
        return "psycopg / psycopg-pool are not installed (pip install -e '.[test]')"
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PgServer:
    """One PostgreSQL cluster: ``start()`` (initdb the first time), ``stop()``,
    ``restart()``, ``close()`` (kill it, remove its folder).  Called from the test's thread."""

    def __init__(self) -> None:
        bindir = find_bindir()
        if bindir is None:
            raise RuntimeError(why_no_server())
        self.bindir = Path(bindir)
        self.root = Path(tempfile.mkdtemp(prefix="jobq-pg-"))
        self.data = self.root / "data"
        self.sockets = self.root / "sock"
        self.log_path = self.root / "server.log"
        self.port = 0
        self._as_postgres = os.geteuid() == 0
        try:
            self._initdb()
        except BaseException:
            shutil.rmtree(self.root, ignore_errors=True)
            raise

    # -- running the server's own programs ---------------------------------------------
    def _run(self, *args: str, timeout: float = 120.0) -> subprocess.CompletedProcess:
        prefix = ["runuser", "-u", SUPERUSER, "--"] if self._as_postgres else []
        env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
        env["LC_ALL"] = "C"
        res = subprocess.run([*prefix, *args], capture_output=True, text=True, env=env,
                             timeout=timeout, cwd=self.root, stdin=subprocess.DEVNULL)
        if res.returncode != 0:
            raise RuntimeError(f"{Path(args[0]).name} failed ({res.returncode}): "
                               f"{res.stderr.strip() or res.stdout.strip()}\n{self.log()}")
        return res

    def _initdb(self) -> None:
        self.sockets.mkdir()
        pwfile = self.root / "pwfile"
        pwfile.write_text(PASSWORD + "\n")
        if self._as_postgres:
            shutil.chown(self.root, SUPERUSER, SUPERUSER)
            shutil.chown(self.sockets, SUPERUSER, SUPERUSER)
            shutil.chown(pwfile, SUPERUSER, SUPERUSER)
        self._run(str(self.bindir / "initdb"), "-D", str(self.data), "-U", SUPERUSER,
                  "-E", "UTF8", "--locale=C", "--auth-local=trust",
                  "--auth-host=scram-sha-256", f"--pwfile={pwfile}", "--no-sync")
        pwfile.unlink()

    def _configure(self, port: int) -> None:
        # postgresql.auto.conf is read last: these win over postgresql.conf, and survive
        # a restart (the port stays the same across stop/start/restart).
        settings = {
            "port": str(port),
            "listen_addresses": "'127.0.0.1'",
            "unix_socket_directories": f"'{self.sockets}'",
            "fsync": "off",
            "synchronous_commit": "off",
            "full_page_writes": "off",
            "shared_buffers": "'16MB'",
            "max_connections": "100",
            "logging_collector": "off",
            "log_min_messages": "warning",
        }
        with open(self.data / "postgresql.auto.conf", "a") as f:
            for key, value in settings.items():
                f.write(f"{key} = {value}\n")

    # -- lifecycle ---------------------------------------------------------------------
    def start(self) -> None:
        """Start the server (the first time on a free port, kept for later starts)."""
        if self.port:
            self._pg_ctl("start")
            return
        for _ in range(5):  # a free port may be taken between free_port() and the bind
            port = free_port()
            self._configure(port)
            try:
                self.port = port
                self._pg_ctl("start")
                return
            except RuntimeError:
                self.port = 0
                if "Address already in use" not in self.log():
                    raise
        raise RuntimeError(f"no free port for PostgreSQL after 5 tries\n{self.log()}")

    def _pg_ctl(self, action: str, *extra: str) -> None:
        args = [str(self.bindir / "pg_ctl"), action, "-D", str(self.data), "-w",
                "-t", str(int(START_WITHIN)), *extra]
        if action in ("start", "restart"):
            args += ["-l", str(self.log_path)]
        self._run(*args, timeout=START_WITHIN + 30)

    def stop(self) -> None:
        """A fast shutdown (connections are cut), waiting until it is down."""
        self._pg_ctl("stop", "-m", "fast")

    def restart(self) -> None:
        """``pg_ctl restart -m fast``: every connection is cut; same port afterwards."""
        self._pg_ctl("restart", "-m", "fast")

    @property
    def pid(self) -> int | None:
        """The postmaster's pid (for SIGSTOP tests), None when it is not running."""
        try:
            pid = int((self.data / "postmaster.pid").read_text().split("\n", 1)[0])
        except (OSError, ValueError):
            return None
        return pid if psutil.pid_exists(pid) else None

    def running(self) -> bool:
        return self.pid is not None

    def ensure_running(self) -> None:
        """After a test that stopped or froze the server: thaw it, start it if it is down."""
        pid = self.pid
        if pid is not None:
            self._signal_all(pid, signal.SIGCONT)
        else:
            self.start()

    @staticmethod
    def _signal_all(pid: int, sig: int) -> None:
        try:
            procs = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
        except psutil.NoSuchProcess:
            return
        for proc in procs:
            try:
                proc.send_signal(sig)
            except psutil.NoSuchProcess:
                pass

    def processes(self) -> list[psutil.Process]:
        """The postmaster and its children, while it runs."""
        pid = self.pid
        if pid is None:
            return []
        try:
            return [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def close(self) -> None:
        """Kill the server (even a frozen one) and remove its folder."""
        procs = self.processes()
        for proc in procs:
            try:
                proc.send_signal(signal.SIGCONT)  # a SIGSTOPped one could not act on SIGQUIT
            except psutil.NoSuchProcess:
                pass
        if procs:
            try:
                self._pg_ctl("stop", "-m", "immediate")
            except (RuntimeError, subprocess.SubprocessError):
                pass
            _gone, alive = psutil.wait_procs(procs, timeout=10)
            for proc in alive:
                try:
                    proc.kill()
                except psutil.NoSuchProcess:
                    pass
            psutil.wait_procs(alive, timeout=10)
        shutil.rmtree(self.root, ignore_errors=True)

    def log(self) -> str:
        return log_tail(self.log_path)

    # -- clients -----------------------------------------------------------------------
    def url(self, dbname: str = "postgres", user: str = SUPERUSER,
            password: str | None = PASSWORD) -> str:
        """A libpq URI over TCP (password authentication) to ``dbname``."""
        auth = quote(user, safe="")
        if password is not None:
            auth += ":" + quote(password, safe="")
        return f"postgresql://{auth}@127.0.0.1:{self.port}/{quote(dbname, safe='')}"

    def admin(self, sql: str, dbname: str = "postgres", params: tuple = ()) -> list[tuple]:
        """Run one statement as the superuser (autocommit, over the unix socket); its rows."""
        import psycopg

        with psycopg.connect(host=str(self.sockets), port=self.port, user=SUPERUSER,
                             dbname=dbname, autocommit=True, connect_timeout=30) as conn:
            cur = conn.execute(sql, params)
            return cur.fetchall() if cur.description else []

    def create_database(self, name: str | None = None) -> str:
        """A new empty database (from template0); returns its name."""
        name = name or "t_" + uuid.uuid4().hex[:16]
        self.admin(f'CREATE DATABASE "{name}" TEMPLATE template0')
        return name

    def drop_database(self, name: str) -> None:
        self.admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def psql(self, sql: str, url: str) -> subprocess.CompletedProcess:
        """``psql`` (the server's) runs ``sql`` against ``url``, stopping at the first error."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
        return subprocess.run([str(self.bindir / "psql"), "-X", "-q", "-v", "ON_ERROR_STOP=1",
                               "-d", url], input=sql, capture_output=True, text=True,
                              timeout=60, env=env)


def wait_port_closed(port: int, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
        except OSError:
            return True
        time.sleep(0.05)
    return False


def log_tail(path: Path) -> str:
    """The last 4,000 characters of a server's log (a server of the tests: PostgreSQL's,
    PgBouncer's), or nothing when there is none yet."""
    try:
        return path.read_text(errors="replace")[-4000:]
    except OSError:
        return ""
