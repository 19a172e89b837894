"""A real PgBouncer in transaction pooling mode in front of the session's PostgreSQL server
(tests/postgres/server.py), for the tests of what works through it.

Debian's ``pgbouncer`` package (scripts/test installs it where it is missing).  Its
configuration, auth file, pid file and log live in a ``tempfile.mkdtemp`` folder (the postgres
user must read it: pytest's tmp_path is private to root); it listens on a free loopback port
and no unix socket.  PgBouncer refuses to run as root, so when we are root it runs as the
``postgres`` user (``runuser -u postgres --``, like the server), in the foreground as a child
of the test process: ``close()`` ends it (SIGTERM, then SIGKILL) and waits until neither it
nor runuser is left.

Every database of the server is reachable through it (``* =``): ``url(dbname)`` is the test
database's URL with the bouncer's port.  Pools are small (3 server connections per database
and user) and server connections are handed out round robin, so that two transactions of
one client run on different server connections: whatever relies on session state (a
prepared statement, a session advisory lock, ``SET``, ``LISTEN``) breaks here as it would in
production instead of being saved by the same server connection coming back.

Called from the test's thread.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from urllib.parse import quote

import psutil

from tests.postgres.server import PASSWORD, SUPERUSER, PgServer, free_port, log_tail

START_WITHIN = 30.0  # s: the bouncer accepts connections within this
STOP_WITHIN = 10.0  # s: SIGTERM ends it within this, else SIGKILL
POOL_SIZE = 3  # server connections per (database, user)


def find_pgbouncer() -> str | None:
    """The pgbouncer program (Debian puts it in /usr/sbin, not on a user's PATH), or None."""
    found = shutil.which("pgbouncer")
    if found:
        return found
    return "/usr/sbin/pgbouncer" if os.access("/usr/sbin/pgbouncer", os.X_OK) else None


def why_no_bouncer() -> str | None:
    """Why the PgBouncer tests cannot run here (one line), or None."""
    if find_pgbouncer() is None:
        return ("PgBouncer is not installed (no pgbouncer on PATH nor in /usr/sbin; "
                "apt-get install pgbouncer, as scripts/test does)")
    return None


class PgBouncer:
    """One PgBouncer in ``pool_mode = transaction`` in front of ``server`` (over TCP, as the
    superuser with its password: SCRAM to the server, SCRAM from the clients)."""

    def __init__(self, server: PgServer) -> None:
        program = find_pgbouncer()
        if program is None:
            raise RuntimeError(why_no_bouncer())
        self.program = program
        self.server = server
        self.root = Path(tempfile.mkdtemp(prefix="jobq-pgbouncer-"))
        self.ini = self.root / "pgbouncer.ini"
        self.log_path = self.root / "pgbouncer.log"
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self._as_postgres = os.geteuid() == 0

    def _write_config(self, port: int) -> None:
        userlist = self.root / "userlist.txt"
        # A plain-text password: PgBouncer checks the clients' SCRAM with it and logs in to
        # the server with it.
        userlist.write_text(f'"{SUPERUSER}" "{PASSWORD}"\n')
        self.ini.write_text("\n".join([
            "[databases]",
            f"* = host=127.0.0.1 port={self.server.port}",
            "[pgbouncer]",
            "listen_addr = 127.0.0.1",
            f"listen_port = {port}",
            "unix_socket_dir =",
            f"pidfile = {self.root / 'pgbouncer.pid'}",
            f"logfile = {self.log_path}",
            "auth_type = scram-sha-256",
            f"auth_file = {userlist}",
            f"admin_users = {SUPERUSER}",
            "pool_mode = transaction",
            f"default_pool_size = {POOL_SIZE}",
            "max_client_conn = 200",
            "server_round_robin = 1",
            "server_login_retry = 1",
            "",
        ]))
        if self._as_postgres:
            for path in (self.root, userlist, self.ini):
                shutil.chown(path, SUPERUSER, SUPERUSER)
            os.chmod(userlist, 0o600)

    def start(self) -> None:
        """Start it on a free loopback port; returns once it accepts connections."""
        for _ in range(5):  # a free port may be taken between free_port() and the bind
            port = free_port()
            self._write_config(port)
            prefix = ["runuser", "-u", SUPERUSER, "--"] if self._as_postgres else []
            env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
            self.proc = subprocess.Popen([*prefix, self.program, str(self.ini)],
                                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                         stderr=subprocess.DEVNULL, cwd=self.root, env=env,
                                         start_new_session=True)
            self.port = port
            if self._wait_listening():
                return
            self._end()
            if "Address already in use" not in self.log():
                raise RuntimeError(f"pgbouncer did not start\n{self.log()}")
        raise RuntimeError(f"no free port for pgbouncer after 5 tries\n{self.log()}")

    def _wait_listening(self) -> bool:
        assert self.proc is not None
        deadline = time.monotonic() + START_WITHIN
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                return True
            except OSError:
                time.sleep(0.05)
        return False

    def processes(self) -> list[psutil.Process]:
        """runuser (when root) and pgbouncer, while they run."""
        if self.proc is None:
            return []
        try:
            top = psutil.Process(self.proc.pid)
            return [top, *top.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def _end(self) -> None:
        procs = self.processes()
        # SIGTERM to pgbouncer itself (runuser would pass it on, but not when it is gone).
        for proc in reversed(procs):
            try:
                proc.send_signal(signal.SIGTERM)
            except psutil.NoSuchProcess:
                pass
        _gone, alive = psutil.wait_procs(procs, timeout=STOP_WITHIN)
        for proc in alive:
            try:
                proc.kill()
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(alive, timeout=STOP_WITHIN)
        if self.proc is not None:
            try:
                self.proc.wait(STOP_WITHIN)
            except subprocess.TimeoutExpired:
                pass
            self.proc = None

    def close(self) -> None:
        """Stop it and remove its folder; nothing of it is left running."""
        self._end()
        shutil.rmtree(self.root, ignore_errors=True)

    def log(self) -> str:
        return log_tail(self.log_path)

    def url(self, dbname: str) -> str:
        """A libpq URI to ``dbname`` through the bouncer (the superuser, its password)."""
        return (f"postgresql://{quote(SUPERUSER, safe='')}:{quote(PASSWORD, safe='')}"
                f"@127.0.0.1:{self.port}/{quote(dbname, safe='')}")

    def warm(self, dbname: str) -> None:
        """Open all POOL_SIZE server connections to ``dbname`` now (transactions held side
        by side), so that the round robin spreads a client's transactions over them from its
        first one on."""
        import psycopg

        conns = [psycopg.connect(self.url(dbname), connect_timeout=10)
                 for _ in range(POOL_SIZE)]
        try:
            for conn in conns:
                conn.execute("SELECT 1")  # a transaction (not autocommit) holds its server
            for conn in conns:
                conn.commit()  # a client gone mid-transaction would cost its server
        finally:
            for conn in conns:
                conn.close()

    def show(self, what: str) -> list[tuple]:
        """``SHOW what`` on the admin console (the ``pgbouncer`` database, which speaks only
        the simple query protocol: a ClientCursor)."""
        import psycopg

        with psycopg.connect(self.url("pgbouncer"), autocommit=True, connect_timeout=10,
                             cursor_factory=psycopg.ClientCursor) as conn:
            return conn.execute(f"SHOW {what}").fetchall()
