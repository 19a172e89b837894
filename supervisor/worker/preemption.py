"""Signals to the supervisor itself: handlers only enqueue the signal number.

The main loop reads the same SimpleQueue it uses for its other events (see worker/events.py: a
finished spawn, a task's output closed, a Scheduled Events change), so a signal wakes it at
once.

The Azure Scheduled Events poller (below) is the other source of "stop now": its thread polls
the instance metadata endpoint and reports a Preempt/Terminate for this VM -- or its
cancellation -- through a callback; it never signals a process.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import signal
import socket
import threading
import time
from collections.abc import Collection, Mapping
from datetime import timezone
from types import FrameType
from typing import TYPE_CHECKING, Callable, Optional, Union

from ..core.kernel_files import read_kernel_file
from ..core.settings import (
    SCHEDULED_EVENTS_URL as SCHEDULED_EVENTS_URL,  # the one copy; re-exported
)
from ..core.signals import CAUGHT_SIGNALS, INHERITED_IGNORED
from ..core.threads import start_thread
from .events import Event, PreemptEvent

if TYPE_CHECKING:  # imported where used: a worker off Azure never loads http/email/ssl
    import urllib.request

# What signal.signal returns: the handler it replaced (SIG_DFL and SIG_IGN are ints).
PreviousHandler = Union[Callable[[int, Optional[FrameType]], object], int, None]

class SignalQueue:
    """Installs handlers that put the signal number on ``events`` (main thread): every signal
    of the table in core/signals.py, whose default action would end the worker without its
    shutdown path.  Each is a handler, never SIG_IGN: exec resets a handler to the default,
    so a task starts with default dispositions whatever the worker does with them."""

    def __init__(self, events: queue.SimpleQueue[Event]) -> None:
        self.events = events
        self._previous: dict[int, PreviousHandler] = {}
        # Started under nohup, we inherit SIGHUP ignored: it stays ignored (logged by the
        # main loop), while a task gets it at its default.
        self.inherited_ignored: frozenset[int] = frozenset()

    def _handler(self, signum: int, frame: FrameType | None) -> None:
        # Only this: no logging, no locks, no Event.set() in a signal handler.
        self.events.put_nowait(signum)

    def install(self) -> None:
        """Install the handlers; once only (worker/main.py installs them before the backend is
        opened, and the worker then takes the queue over)."""
        if self._previous:
            return
        self.inherited_ignored = frozenset(
            sig for sig in INHERITED_IGNORED if signal.getsignal(sig) == signal.SIG_IGN)
        for sig in sorted(CAUGHT_SIGNALS):
            self._previous[sig] = signal.signal(sig, self._handler)

    def restore(self) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        self._previous.clear()


# --------------------------------------------------------------------------------------------
# Azure Scheduled Events: a Spot eviction (Preempt) or a Terminate announced for this VM.

log = logging.getLogger("jobq.preemption")

COMPUTE_NAME_PATH = "/metadata/instance/compute/name?api-version=2021-02-01&format=text"
AZURE_ASSET_TAG = "7783-7084-3265-9085-8269-3286-77"
PREEMPT_EVENT_TYPES = ("Preempt", "Terminate")
WARN_EVERY = 60.0  # an unreachable endpoint is worth one log line a minute, not one per poll
MAX_DOCUMENT = 1 << 20  # the real document is a few KiB; never buffer an unbounded body


def _fetch_errors() -> tuple[type[Exception], ...]:
    """What a metadata request may raise (URLError is an OSError); only evaluated by an
    ``except`` once something was raised, so http.client is loaded by then anyway."""
    import http.client

    return (OSError, http.client.HTTPException, ValueError)


def is_azure_vm(dmi_dir: str = "/sys/class/dmi/id") -> bool:
    """Whether this looks like an Azure VM, from DMI alone -- no network call (any thread).

    Azure sets a fixed chassis asset tag; older images only show Hyper-V's vendor/product
    pair (which an on-premises Hyper-V guest shares: hence JOBQ_DISABLE_SCHEDULED_EVENTS).
    """
    def dmi(name: str) -> str:
        return read_kernel_file(os.path.join(dmi_dir, name), "")

    if dmi("chassis_asset_tag") == AZURE_ASSET_TAG:
        return True
    return dmi("sys_vendor") == "Microsoft Corporation" and dmi("product_name") == "Virtual Machine"


def scheduled_events_enabled(mode: str, env: Mapping[str, str],
                             dmi_dir: str = "/sys/class/dmi/id") -> bool:
    """``on``/``off``/``auto`` -> whether to run the poller (main thread, at start-up)."""
    if mode == "on":
        return True
    if mode == "off":
        return False
    if mode == "auto":
        return env.get("JOBQ_DISABLE_SCHEDULED_EVENTS") != "1" and is_azure_vm(dmi_dir)
    raise ValueError(f"scheduled events mode must be on, off or auto, not {mode!r}")


def parse_not_before(text: str) -> float | None:
    """RFC 1123 ``NotBefore`` ("Mon, 19 Sep 2016 18:29:47 GMT") -> epoch seconds, or None."""
    if not text or not text.strip():
        return None
    try:
        from email.utils import parsedate_to_datetime

        when = parsedate_to_datetime(text.strip())
    except (TypeError, ValueError, IndexError):
        # DEBUG: this runs on every poll; the transition's WARNING says the time is unknown.
        log.debug("Scheduled Events: cannot parse NotBefore %r", text)
        return None
    if when.tzinfo is None:  # "-0000" means UTC with an unknown local zone
        when = when.replace(tzinfo=timezone.utc)
    return when.timestamp()


def imds_base(url: str) -> str:
    """``http://host:port/metadata/...`` -> ``http://host:port`` (for local_vm_names)."""
    import urllib.parse

    parts = urllib.parse.urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


def _opener() -> urllib.request.OpenerDirector:
    # The metadata endpoint is link-local: an http_proxy from the environment must never
    # see (or answer) these requests.
    import urllib.request

    return urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _open(opener: urllib.request.OpenerDirector, request: urllib.request.Request,
          timeout: float) -> bytes:
    import urllib.error

    try:
        with opener.open(request, timeout=timeout) as resp:
            body: bytes = resp.read(MAX_DOCUMENT + 1)
    except urllib.error.HTTPError as exc:
        exc.close()  # it holds the response socket
        raise
    if len(body) > MAX_DOCUMENT:
        raise ValueError(f"response larger than {MAX_DOCUMENT} bytes")
    return body


def local_vm_names(metadata_base: str | None) -> set[str]:
    """The names under which Scheduled Events may list this VM (main thread, at start-up).

    The hostname always; the Azure compute name (what a scale set lists, e.g. ``vmss_3``)
    only when ``metadata_base`` is given -- one request with a 2 s timeout, failures ignored.
    """
    host = socket.gethostname()
    names = {host, host.split(".")[0]} - {""}
    if metadata_base:
        url = metadata_base.rstrip("/") + COMPUTE_NAME_PATH
        import urllib.request

        request = urllib.request.Request(url, headers={"Metadata": "true"})
        try:
            name = _open(_opener(), request, 2.0).decode("utf-8").strip()
        except _fetch_errors() as exc:
            log.debug("cannot read the VM's compute name from %s: %s", url, exc)
        else:
            if name:
                names.add(name)
    return names


class ScheduledEventsPoller:
    """Polls Scheduled Events on its own thread and reports transitions of *the* relevant event.

    The relevant event is the first Preempt/Terminate whose Resources is empty or names this
    VM.  ``on_change(event)`` runs on the poller thread when one appears or its id changes, and
    ``on_change(None)`` when it disappears (Azure can cancel); it must be quick and must not
    signal a process (it sets/clears the worker's preempt request and wakes the main loop).
    Main thread: ``start``, ``stop``, ``acknowledge``.  Poller thread: everything else.
    """

    def __init__(self, url: str, *, interval: float,
                 on_change: Callable[[PreemptEvent | None], None],
                 vm_names: Collection[str], timeout: float = 2.0) -> None:
        self.url = url
        self.interval = interval
        self.timeout = timeout
        self.current: PreemptEvent | None = None
        self.failures = 0  # consecutive failed polls
        self._on_change = on_change
        # Hostnames are case-insensitive; Azure lists the names as they were created.
        self._vm_names = {name.lower() for name in vm_names if name}
        self._opener = _opener()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._warned_at: float | None = None
        self._suppressed = 0
        self.clock: Callable[[], float] = time.monotonic  # paces the warnings; tests swap it

    # -- main thread ---------------------------------------------------------------------
    def start(self) -> None:
        self._thread = start_thread(self._run, "scheduled-events")

    def stop(self, timeout: float | None = None) -> bool:
        """Stop polling and join; a request in flight ends within its own timeout.

        Returns whether the thread ended within ``timeout`` (default: the request timeout plus
        one second).  The thread is a daemon, so a stuck one never blocks the exit.
        """
        self._stop.set()
        if self._thread is None:
            return True
        self._thread.join(self.timeout + 1.0 if timeout is None else timeout)
        return not self._thread.is_alive()

    def is_alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def acknowledge(self, event_id: str) -> bool:
        """Tell Azure we are ready (StartRequests) so the event may start now.  Never raises."""
        import urllib.request

        body = json.dumps({"StartRequests": [{"EventId": event_id}]}).encode()
        request = urllib.request.Request(
            self.url, data=body, method="POST",
            headers={"Metadata": "true", "Content-Type": "application/json"})
        try:
            _open(self._opener, request, self.timeout)
        except _fetch_errors() as exc:
            log.warning("Scheduled Events: acknowledging %s failed: %s", event_id, exc)
            return False
        log.info("Scheduled Events: acknowledged %s", event_id)
        return True

    # -- poller thread -------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            self.poll_once()
            self._stop.wait(max(0.0, started + self.interval - time.monotonic()))

    def poll_once(self) -> None:
        """One GET and, on a transition, one on_change call (poller thread, or a test)."""
        import urllib.request

        request = urllib.request.Request(self.url, headers={"Metadata": "true"})
        try:
            event = self.relevant(json.loads(_open(self._opener, request, self.timeout)))
        except _fetch_errors() as exc:
            self._failed(exc)
            return
        if self.failures:
            log.info("Scheduled Events endpoint answers again after %d failed poll(s)",
                     self.failures)
            self.failures = 0
        if self._stop.is_set():
            return  # stopped while the request was in flight: nobody is listening any more
        self._transition(event)

    def relevant(self, doc: object) -> PreemptEvent | None:
        """The first Preempt/Terminate for this VM in a document; ValueError if malformed."""
        if not isinstance(doc, dict) or not isinstance(doc.get("Events"), list):
            raise ValueError("not a Scheduled Events document (no Events list)")
        for raw in doc["Events"]:
            if not isinstance(raw, dict):
                raise ValueError(f"malformed event {raw!r}")
            event_type = raw.get("EventType")
            if event_type not in PREEMPT_EVENT_TYPES:
                continue
            resources = raw.get("Resources") or []
            if not isinstance(resources, list):
                raise ValueError(f"malformed Resources {resources!r}")
            if resources and not any(str(r).lower() in self._vm_names for r in resources):
                continue  # another VM of the same scale set / availability set
            event_id = raw.get("EventId")
            if not isinstance(event_id, str) or not event_id:
                raise ValueError(f"{event_type} event without an EventId")
            not_before = raw.get("NotBefore")
            return PreemptEvent(event_id, str(event_type),
                                parse_not_before(not_before if isinstance(not_before, str)
                                                 else ""))
        return None

    def _transition(self, event: PreemptEvent | None) -> None:
        old = self.current
        if (old.event_id if old else None) == (event.event_id if event else None):
            return
        self.current = event
        if event is None:
            assert old is not None
            log.warning("Scheduled Events: %s %s is gone (cancelled)", old.event_type,
                        old.event_id)
        else:
            left = event.seconds_left(time.time())
            log.warning("Scheduled Events: %s %s for this VM%s", event.event_type,
                        event.event_id,
                        ", NotBefore unknown" if left is None else f", {left:.0f}s left")
        try:
            self._on_change(event)
        except Exception:  # a bug in the callback must not end preemption polling
            log.exception("Scheduled Events: on_change(%r) failed", event)

    def _failed(self, exc: BaseException) -> None:
        self.failures += 1
        now = self.clock()
        if self._warned_at is None or now - self._warned_at >= WARN_EVERY:
            more = f" ({self._suppressed} more failure(s) since the last warning)" \
                if self._suppressed else ""
            log.warning("Scheduled Events endpoint %s failed: %s%s; still polling",
                        self.url, exc, more)
            self._warned_at = now
            self._suppressed = 0
        else:
            self._suppressed += 1
            log.debug("Scheduled Events endpoint %s failed: %s", self.url, exc)
