"""systemd's sd_notify protocol over $NOTIFY_SOCKET, stdlib only.

One datagram per message on an AF_UNIX SOCK_DGRAM socket (``READY=1``, ``STATUS=...``,
``WATCHDOG=1``, ``STOPPING=1``, ``RELOADING=1``).  Without NOTIFY_SOCKET every call is a
no-op, so the worker calls these unconditionally.  Sending never raises: systemd being gone
(or the socket being unwritable) must not stop the worker, so failures are logged at DEBUG
only.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Mapping

log = logging.getLogger("jobq.notify")


class Notifier:
    """Sends sd_notify messages.  Stateless apart from the address: any thread may call it."""

    def __init__(self, socket_path: str | None = None,
                 env: Mapping[str, str] | None = None) -> None:
        self._env: Mapping[str, str] = os.environ if env is None else env
        path = socket_path if socket_path is not None else self._env.get("NOTIFY_SOCKET")
        self.socket_path = path or None
        self._address: str | bytes | None = None
        if self.socket_path:
            if self.socket_path.startswith("@"):
                # Abstract namespace: systemd writes it with '@', the kernel wants a NUL byte.
                self._address = b"\0" + self.socket_path[1:].encode()
            else:
                self._address = self.socket_path

    @property
    def enabled(self) -> bool:
        return self._address is not None

    def send(self, text: str) -> bool:
        """Send one datagram (any thread).  Returns whether it went out; never raises."""
        if self._address is None:
            return False
        try:
            # A fresh socket per message: no shared state between threads, and a restarted
            # systemd (new socket inode) is picked up without reconnect logic.  Python sockets
            # are close-on-exec, so task processes never inherit it.
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
                # Never block the main loop on a reader that is slow or gone: a full
                # socket queue drops this message (EAGAIN) instead.
                sock.setblocking(False)
                sock.sendto(text.encode(), self._address)
            return True
        except OSError as exc:
            log.debug("sd_notify %r to %s failed: %s", text, self.socket_path, exc)
            return False

    def ready(self) -> bool:
        """Start-up finished (main thread, once the loop is about to poll)."""
        return self.send("READY=1")

    def status(self, text: str) -> bool:
        """A one-line status for ``systemctl status`` (main thread)."""
        # A newline would start a new KEY=VALUE assignment in the datagram.
        return self.send("STATUS=" + " ".join(text.splitlines()))

    def watchdog(self) -> bool:
        """Keep-alive ping (main thread: a stuck main loop must stop the pings)."""
        return self.send("WATCHDOG=1")

    def reloading(self) -> bool:
        """A reload began (main thread); ``READY=1`` ends it.  ``MONOTONIC_USEC``: when, on
        CLOCK_MONOTONIC, as sd_notify(3) asks (systemd 253's Type=notify-reload checks it)."""
        return self.send(f"RELOADING=1\nMONOTONIC_USEC={time.monotonic_ns() // 1000}")

    def stopping(self) -> bool:
        """Shutdown began (main thread)."""
        return self.send("STOPPING=1")

    def watchdog_interval(self) -> float | None:
        """WatchdogSec= in seconds, or None when systemd does not watch us (any thread).

        Only when WATCHDOG_PID is unset or names this process: a child that inherited the
        variables from a watched parent must not think it is the one being watched.  The
        caller pings at half this interval, as sd_watchdog_enabled(3) recommends.
        """
        usec = self._env.get("WATCHDOG_USEC", "").strip()
        if not usec:
            return None
        pid = self._env.get("WATCHDOG_PID", "").strip()
        if pid:
            try:
                if int(pid) != os.getpid():
                    return None
            except ValueError:
                return None
        try:
            value = int(usec)
        except ValueError:
            log.debug("ignoring WATCHDOG_USEC=%r: not an integer", usec)
            return None
        if value <= 0:
            return None
        return value / 1_000_000
