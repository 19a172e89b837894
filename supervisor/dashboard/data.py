"""What the dashboard reads and writes: the backend and the control store, opened once per
thread (waitress's request threads, the depth sampler) because neither SQLite connections nor
SDK clients may be shared across threads.  The dicts are the ones ``jobq-ctl status --json``
and ``jobq-ctl workers --json`` print (ops/fleet.py builds both).

Any backend or store error becomes ``Unavailable`` (a 503 page); the thread's clients are
closed and reopened on its next request, so one failure never sticks.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any, TypedDict, TypeVar

from ..backends.base import Backend, BackendConfigError, BackendError, BackendRefused
from ..core.secret_names import is_secret
from ..core.signing import SigningKey
from ..core.task import Task, TaskFormatError
from ..fleet.control.base import (
    ControlStore,
    ControlStoreError,
    ControlStoreRefused,
    worker_states,
)
from ..fleet.control.records import HistoryPoint
from ..fleet.output.base import OutputStore, OutputStoreError
from ..ops import fleet
from ..ops.audit import VIA_DASHBOARD, ActionJson, actions_json, record_action
from ..ops.fleet import (
    StatusJson,
    WorkerJson,
    live_worker_ids,
    put_commands,
    put_pause,
    status_json,
    worker_view,
    workers_json,
)
from ..ops.results import results_json, task_results
from ..ops.short_ids import resolve
from ..ops.times import iso_or_none

T = TypeVar("T")


class FlagJson(TypedDict):
    """A queue's pause flag as the pages show it."""

    paused: bool
    who: str
    when: str | None


STORE_ERRORS = (BackendError, BackendConfigError, ControlStoreError, OutputStoreError)
REFUSALS = (BackendRefused, ControlStoreRefused)  # the dashboard's identity may not write
MASK = "********"
# Messages a task lookup peeks at on Azure, where no row names a pending task: Storage
# Queue's peek returns at most 32 (the service's limit); Service Bus peeks as many, so a
# page says one number for both.
PEEKED = 32


def masked(env: dict[str, str]) -> dict[str, str]:
    """A task's environment as a page shows it: a value hidden when its name looks like a
    secret's or it holds a credential (the rule the worker strips its own secrets by,
    core/secret_names.py; a waitress thread, per page view)."""
    return {k: MASK if is_secret(k, v) else v for k, v in env.items()}


def task_facts(task: Task) -> dict[str, Any]:
    """What a task's message says beyond its command: the task page's facts."""
    return {"cmd": task.cmd, "env": masked(task.env), "cwd": task.cwd,
            "priority": task.priority, "timeout_s": task.timeout,
            "not_before": iso_or_none(task.not_before), "max_attempts": task.max_attempts,
            "unique_key": task.unique_key}


class Refused(Exception):
    """The queue or the control store refused a write to the dashboard's identity (a
    read-only database role): a 403 page that says so, not "unavailable"."""

    def __init__(self, what: str, text: str) -> None:
        super().__init__(f"{what}: {text}")
        self.what = what
        self.text = text


class Unavailable(Exception):
    """The queue or the control store cannot be reached (or is not configured)."""

    def __init__(self, what: str, text: str) -> None:
        super().__init__(f"{what}: {text}")
        self.what = what
        self.text = text


def count_states(by_queue: list[dict[str, str]]) -> dict[str, int]:
    """Workers by state over several queues' listings; a worker of several queues has a
    record in each and counts once (its first queue's state)."""
    seen: dict[str, str] = {}
    for by_id in by_queue:
        for wid, state in by_id.items():
            seen.setdefault(wid, state)
    counts: dict[str, int] = {}
    for state in seen.values():
        counts[state] = counts.get(state, 0) + 1
    return counts


class DataSource:
    """Per-thread clients plus the reads and writes of the pages.  Any thread; each thread
    uses its own clients."""

    def __init__(self, queue: str, open_backend: Callable[[], Backend],
                 open_store: Callable[[], ControlStore | None],
                 key: SigningKey | None = None,
                 open_output: Callable[[], OutputStore | None] | None = None) -> None:
        self.queue = queue
        self._open_backend = open_backend
        self._open_store = open_store
        self._open_output = open_output or (lambda: None)
        self.key = key
        self._local = threading.local()

    # ------------------------------------------------------------------ clients
    def _client(self, name: str, opener: Callable[[], T], what: str) -> T:
        if not hasattr(self._local, name):
            try:
                setattr(self._local, name, opener())
            except STORE_ERRORS as exc:
                raise Unavailable(what, str(exc)) from None
        client: T = getattr(self._local, name)
        return client

    @contextlib.contextmanager
    def using(self, what: str) -> Iterator[None]:
        try:
            yield
        except REFUSALS as exc:  # the connection is fine: keep it
            raise Refused(what, str(exc)) from None
        except STORE_ERRORS as exc:
            # a broken connection must not serve the next request of this thread
            self.close_thread()
            raise Unavailable(what, str(exc)) from None

    def backend(self) -> Backend:
        return self._client("backend", self._open_backend, "queue")

    def store(self) -> ControlStore:
        store = self._client("store", self._open_store, "control store")
        if store is None:
            raise Unavailable("control store", "none is configured (see jobq-ctl workers)")
        return store

    def output(self) -> OutputStore:
        store = self._client("output", self._open_output, "output store")
        if store is None:
            raise Unavailable("output store", "none is configured: task output is kept "
                              "beside the control store")
        return store

    def close_thread(self) -> None:
        """Close this thread's clients (the sampler when it stops; after an error)."""
        for name in ("output", "store", "backend"):
            thing = self._local.__dict__.pop(name, None)
            if thing is not None:
                with contextlib.suppress(Exception):  # closing a broken client
                    thing.close()

    def optional_store(self) -> ControlStore | None:
        try:
            return self.store()
        except Unavailable:
            return None

    # ------------------------------------------------------------------ reads
    def status(self) -> StatusJson:
        """``jobq-ctl status --json``; the control store's part is null when it is down."""
        with self.using("queue"):
            data, _ = status_json(self.backend(), self.optional_store(), self.queue)
        return data

    def counts(self) -> dict[str, int]:
        """Counts per state (the sampler's thread)."""
        with self.using("queue"):
            return dict(self.backend().status().counts)

    def cancelled(self) -> int | None:
        """Cancelled tasks, where the backend can count them cheaply (``Backend.admin``:
        SQLite), else None."""
        admin = self.backend().admin()
        if admin is None:
            return None
        with self.using("queue"):
            return admin.cancelled_count()

    def workers(self, show_all: bool = False) -> list[WorkerJson]:
        """``jobq-ctl workers --json`` (``--all`` with ``show_all``)."""
        with self.using("control store"):
            return workers_json(self.store(), self.queue, show_all)

    def put_history(self, point: HistoryPoint) -> None:
        """Keep one minute of the charts in the control store (the sampler's thread)."""
        with self.using("control store"):
            self.store().put_history(point)

    def history(self, since: float) -> list[HistoryPoint]:
        """The charts' minutes kept in the control store from ``since`` on (any thread)."""
        with self.using("control store"):
            return self.store().history(self.queue, since)

    def fleet(self) -> tuple[dict[str, int], FlagJson | None]:
        """(worker count by state, the queue's pause flag) from one workers listing and one
        poll."""
        by_id, flag = self.fleet_states()
        return count_states([by_id]), flag

    def fleet_states(self) -> tuple[dict[str, str], FlagJson | None]:
        """(each worker's state by id, the queue's pause flag)."""
        with self.using("control store"):
            now, shown, _, flag = worker_view(self.store(), self.queue, True)
        states = worker_states(shown, now)
        if flag is None:
            return states, None
        return states, {"paused": flag.paused, "who": flag.who, "when": iso_or_none(flag.when)}

    def worker(self, worker_id: str) -> WorkerJson | None:
        return next((w for w in self.workers(True) if w["id"] == worker_id), None)

    def task(self, task_id: str) -> dict[str, Any] | None:
        """What the queue and the control store know of one task, or None when neither
        knows it.  Environment values that look secret (name or value) are masked."""
        found: dict[str, Any] = {"id": task_id, "state": None, "attempt": None,
                                 "cmd": None, "env": {}, "reason": None, "worker": None,
                                 "lease_expires": None, "attempts": [], "cwd": None,
                                 "priority": None, "timeout_s": None, "not_before": None,
                                 "max_attempts": None, "unique_key": None}
        admin = self.backend().admin()
        job: str | None = "?"  # the job row's status where the queue tells (SQLite)
        if admin is not None:
            job = None
            with self.using("queue"):
                row = admin.task_detail(task_id)
            if row is not None:
                status, attempt, body, reason, by, until = (
                    row.status, row.attempt, row.body, row.reason, row.worker,
                    row.locked_until)
                job = status
                if status == "failed" and (reason or "").startswith("cancelled"):
                    status = "cancelled"  # SQLite keeps a cancelled task as failed
                found.update(state=status, attempt=attempt, reason=reason,
                             worker=by if status == "running" else None,
                             lease_expires=iso_or_none(until) if status == "running" else None)
                try:
                    task = Task.parse(body)
                    found.update(task_facts(task))
                except TaskFormatError:
                    found["cmd"] = "(invalid body)"
        store = self.optional_store()
        if store is not None:
            with self.using("control store"):
                results = task_results(store, self.queue, task_id, lambda: job)
                now = fleet.clock()
                workers = store.workers(self.queue)
            states = worker_states(workers, now)
            running = [(r, t) for r in workers if states[r.id] != "lost"
                       for t in r.tasks if t.id == task_id]
            found["attempts"] = results_json(results, now, states)
            last = found["attempts"][-1] if results else None
            if running:
                rec, info = running[0]
                found.update(worker=rec.id, state=found["state"] or "running",
                             attempt=found["attempt"] or info.attempt,
                             cmd=found["cmd"] or info.cmd,
                             env=found["env"] or {k: MASK for k in info.env_names},
                             lease_expires=iso_or_none(info.lease_expires))
            elif (job == "?" and not (last and last["state"] == "running")
                  and self._peeked(found, task_id, last)):
                # waiting in the queue, whatever an earlier attempt's record says (a running
                # attempt's is believed: Service Bus peeks the messages workers hold too)
                pass
            elif results and found["state"] is None:
                found["state"] = found["attempts"][-1]["state"]
                found["reason"] = found["reason"] or results[-1].reason or None
            if results:
                found["attempt"] = max(found["attempt"] or 0, results[-1].attempt)
        elif job == "?":
            self._peeked(found, task_id, None)
        if found["state"] is None and not found["attempts"]:
            return None
        return found

    def _peeked(self, found: dict[str, Any], task_id: str, last: dict[str, Any] | None
                ) -> bool:
        """Fill ``found`` from the task's message when it is among the first PEEKED of the
        queue (Azure: no row to ask): pending, or cancelled when ``last`` (its newest
        attempt) is a cancel its worker has not taken off the queue yet; whether it is."""
        with self.using("queue"):
            peeked = self.backend().peek(PEEKED)
        task = next((t for t in peeked if isinstance(t, Task) and t.id == task_id), None)
        if task is None:
            return False
        found.update(task_facts(task), state="pending", worker=None, lease_expires=None,
                     reason=None)
        if last is not None and last["state"] == "cancelled" and not last["worker"]:
            found.update(state="cancelled", reason=last["reason"])
        return True

    def resolve_id(self, text: str) -> str:
        """The task id ``text`` names on this queue: a unique prefix of 8 or more characters
        gives the whole id (ops/short_ids.py, on the queue's index, the control store and the
        output store, where there are); raises AmbiguousId."""
        with self.using("queue"):
            admin = self.backend().admin()
            store = self.optional_store()
            try:
                output: OutputStore | None = self.output()
            except Unavailable:
                output = None
            return resolve(text, self.queue, admin, store, output)

    def missing_text(self) -> str:
        """What a task lookup that found nothing could not see (a request thread)."""
        if self.backend().admin() is not None:
            return ""
        return (f" (a pending task is found among the first {PEEKED} messages of the "
                "queue, as many as a peek sees)")

    # ------------------------------------------------------------------ writes
    def pause(self, paused: bool, by: str) -> None:
        with self.using("control store"):
            put_pause(self.store(), self.queue, paused, self.key, by)

    def audit(self, action: str, detail: str, by: str, when: float) -> bool:
        """Keep one operator action in the control store, worded and signed as jobq-ctl's
        (ops/audit.py; a request thread); False when the store is down -- the action is done
        and logged anyway."""
        try:
            with self.using("control store"):
                record_action(self.store(), self.queue, action, detail, by, VIA_DASHBOARD,
                              self.key, when)
        except (Unavailable, Refused):
            return False
        return True

    def audits_or_raise(self, limit: int) -> list[ActionJson]:
        """The newest operator actions, jobq-ctl's and the dashboard's, newest first
        (Unavailable when the store is down); signatures checked with the dashboard's key."""
        with self.using("control store"):
            found = self.store().audits(self.queue, limit)
        return actions_json(found, [self.key] if self.key is not None else [])

    def command(self, worker_id: str, action: str, by: str) -> bool:
        """Send drain/stop to a live worker; False when there is no such live worker."""
        with self.using("control store"):
            store = self.store()
            if worker_id not in live_worker_ids(store, self.queue):
                return False
            put_commands(store, self.queue, [worker_id], action, self.key, by)
        return True

