"""What a failed connection attempt means, in words an operator can act on (any thread; called
by connect.py's ``failure`` while connecting, never for a statement on an open connection).

libpq's own text misleads in two common cases:

* An address that accepts the TCP connection and closes it before the server answers (a
  proxy, a pooler or a load balancer that cannot reach the server behind it) reads
  "server closed the connection unexpectedly ... the server terminated abnormally": a
  crash, where the truth is that the server could not be reached.  Refused, timed-out and
  unroutable attempts get the same plain words: which of them it was, and what to check.
* A ``.pgpass`` line whose database field does not match reads "fe_sendauth: no password
  supplied": the file is named, and the line that nearly matched.

A crash in the middle of a session (the server's process died under a statement) keeps
libpq's words: there they are true.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import psycopg
import psycopg.conninfo

DEFAULT_PORT = "5432"


def describe(url: str | None) -> str:
    """Where ``url`` points, for messages: ``host:port/dbname`` as given (never a password);
    ``the server of the PG* variables`` when the URL names no host."""
    try:
        d = psycopg.conninfo.conninfo_to_dict(url or "")
    except psycopg.Error:
        return "the server of --postgres-url"
    host = str(d.get("host") or d.get("hostaddr") or os.environ.get("PGHOST") or "")
    if not host:
        return "the server of the PG* variables"
    port = str(d.get("port") or os.environ.get("PGPORT") or "")
    db = str(d.get("dbname") or os.environ.get("PGDATABASE") or "")
    return f"{host}{':' + port if port else ''}{'/' + db if db else ''}"


def explain(text: str, url: str | None, default_timeout: int) -> str | None:
    """The line to show for a failed connection attempt to ``url`` whose (one-line,
    redacted) libpq text is ``text``, or None to keep ``text``.  ``default_timeout``: our
    connect_timeout where neither the URL nor $PGCONNECT_TIMEOUT sets one."""
    connect_timeout = _connect_timeout(url, default_timeout)
    low = text.lower()
    if "no password supplied" in low:
        return f"the server asks for a password and none was given: {_pgpass_hint(url)}"
    if "connection refused" in low:
        return ("the server could not be reached: connection refused (nothing listens at "
                "that address and port: is the server running, is the port right?)")
    if "timeout expired" in low or "connection timed out" in low:
        return (f"the server could not be reached: no answer within {connect_timeout} s "
                "(connect_timeout): the host is down, or a firewall or the network drops "
                "the traffic")
    for reason in ("no route to host", "network is unreachable", "host is unreachable"):
        if reason in low:
            return (f"the server could not be reached: {reason} (check the address and the "
                    "network)")
    # libpq says "server closed the connection unexpectedly" for a reset too
    if any(s in low for s in ("server closed the connection unexpectedly",
                              "connection reset by peer", "eof detected")):
        return ("the server could not be reached: the connection was closed before it "
                "answered (a proxy, pooler or load balancer at that address cannot reach the "
                "server, or the server is shutting down); not a crash of a session")
    return None


def _connect_timeout(url: str | None, default: int) -> int:
    try:
        given = _conn_params(url).get("connect_timeout") or os.environ.get("PGCONNECT_TIMEOUT")
        return int(given or default)
    except ValueError:
        return default


def _conn_params(url: str | None) -> dict[str, str]:
    try:
        given = psycopg.conninfo.conninfo_to_dict(url or "")
    except psycopg.Error:
        given = {}
    return {k: str(v) for k, v in given.items() if v is not None}


def _pgpass_hint(url: str | None) -> str:
    """Where libpq looked for a password and why it found none (the .pgpass file's lines)."""
    d = _conn_params(url)
    env = os.environ
    host = d.get("host") or d.get("hostaddr") or env.get("PGHOST") or "localhost"
    if host.startswith("/"):
        host = "localhost"  # a Unix socket: libpq matches .pgpass lines of localhost
    port = d.get("port") or env.get("PGPORT") or DEFAULT_PORT
    user = d.get("user") or env.get("PGUSER") or _login()
    db = d.get("dbname") or env.get("PGDATABASE") or user
    passfile = d.get("passfile") or env.get("PGPASSFILE") or str(Path.home() / ".pgpass")
    wanted = f"{host}:{port}:{db}:{user}"
    try:
        mode = os.stat(passfile).st_mode
        lines = Path(passfile).read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return (f"no password in --postgres-url or PGPASSWORD, and no password file "
                f"{passfile} (a line {wanted}:PASSWORD there would do)")
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        return (f"libpq ignores {passfile}: others may read it (chmod 600 {passfile})")
    near = []
    for line in lines:
        fields = _fields(line)
        if fields is None:
            continue
        h, p, d_, u = fields[:4]
        if _match(h, host) and _match(p, port) and _match(u, user) and not _match(d_, db):
            near.append(d_)
    if near:
        return (f"{passfile} has a line for {host}:{port} user {user} but for database "
                f"{near[0]!r}, not {db!r}: the database field (the third) must name the "
                "database, or be *")
    return (f"no line of {passfile} matches {wanted} (host:port:database:user, each field "
            "the same or *), and neither --postgres-url nor PGPASSWORD has one")


def _fields(line: str) -> list[str] | None:
    """A .pgpass line's five fields (``\\:`` and ``\\\\`` unescaped), None for a comment or a
    short line."""
    if not line.strip() or line.lstrip().startswith("#"):
        return None
    fields: list[str] = []
    current, escaped = "", False
    for ch in line:
        if escaped:
            current += ch
            escaped = False
        elif ch == "\\":
            escaped = True
        elif ch == ":" and len(fields) < 4:
            fields.append(current)
            current = ""
        else:
            current += ch
    fields.append(current)
    return fields if len(fields) == 5 else None


def _match(field: str, value: str) -> bool:
    return field == "*" or field == value


def _login() -> str:
    try:
        import pwd

        return pwd.getpwuid(os.getuid()).pw_name
    except (ImportError, KeyError):
        return os.environ.get("USER", "")
