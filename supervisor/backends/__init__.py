"""Queue backends behind the Backend/Lease seam (see base.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .base import Backend, BackendConfigError

if TYPE_CHECKING:
    from ..core.settings import Settings


AZURE = ("storage-queue", "servicebus")
# The backends whose ``admin()`` answers (a queue that indexes its tasks by id), known before
# one is opened: jobq-ctl opens them for the fleet commands that ask the queue (cancel takes a
# pending task off it; ctl/clients.py).  tests/unit/test_backend_seam.py holds it to the classes.
INDEXED = ("sqlite", "postgres")


def open_backend(settings: Settings, for_ctl: bool = False, create: bool = True,
                 queues: int = 1) -> Backend:
    """Construct the configured backend (main thread).  Raises BackendConfigError/BackendError.

    ``create=False`` (the read-only ``jobq-ctl`` commands): create no database or queue; one
    that does not exist is a BackendError, so a mistyped name is visible instead of "0".

    A worker's several queues (``--queue high,low``): one backend per queue, in a
    ``MultiQueueBackend`` (multi.py); one opened before a failure is closed again.  ``queues``:
    how many the worker asks in turn (Service Bus: each idle receive waits its share of one
    wait, so that an idle turn over them all stays within ``min(1 s, --poll-interval)``)."""
    if len(settings.queues) > 1:
        from dataclasses import replace

        from .multi import MultiQueueBackend

        opened: dict[str, Backend] = {}
        try:
            for name in settings.queues:
                opened[name] = open_backend(replace(settings, queue=name), for_ctl, create,
                                            len(settings.queues))
        except BaseException:
            for backend in opened.values():
                backend.close()
            raise
        return MultiQueueBackend(opened, settings.queue_order)
    if settings.backend == "sqlite":
        from .sqlite.backend import CTL_BUSY_TIMEOUT, MAIN_BUSY_TIMEOUT, SqliteBackend

        return SqliteBackend(
            settings.sqlite_path,
            settings.queue,
            settings.worker_id,
            max_attempts=settings.max_attempts,
            stale_lock_age=settings.stale_age,
            reaper_interval=settings.reaper_every,
            busy_timeout=CTL_BUSY_TIMEOUT if for_ctl else MAIN_BUSY_TIMEOUT,
            create=create,
            serve=not for_ctl,  # a worker starts on the queue (backends/sqlite/queues.py)
            retention=settings.retention,
        )
    if settings.backend == "postgres":
        from .postgres.open import open_postgres

        return open_postgres(settings, for_ctl=for_ctl, create=create)
    # An option of the other Azure backend is a mistake worth one clear line.
    for option, only_for in (("namespace", "servicebus"), ("account_url", "storage-queue")):
        if settings.backend in AZURE and settings.backend != only_for \
                and getattr(settings, option):
            raise BackendConfigError(f"--{option.replace('_', '-')}: only for --backend "
                                     f"{only_for}")
    conn, worker = settings.connection_string, settings.worker_id
    if settings.backend == "storage-queue":
        from .storage_queue.backend import StorageQueueBackend

        # The main thread receives: a hung call must not hold up signal handling long.
        return StorageQueueBackend(settings.queue, connection_string=conn, worker_id=worker,
                                   account_url=settings.account_url, connect_timeout=3.0,
                                   read_timeout=5.0, create=create,
                                   create_failed=for_ctl)  # a worker: at its first record
    if settings.backend == "servicebus":
        from .servicebus.backend import SHORT_RECEIVE_WAIT, ServiceBusBackend

        wait = min(1.0, settings.poll_interval)
        if settings.exit_when_empty:
            # A batch run ends at its first empty receive: a long poll there was a second
            # more at the end of every run.  The short wait still spans several round trips.
            wait = min(wait, SHORT_RECEIVE_WAIT)
        return ServiceBusBackend(settings.queue, connection_string=conn, worker_id=worker,
                                 namespace=settings.namespace, lock_duration=settings.lock,
                                 receivers=0 if for_ctl else settings.num_workers,
                                 receive_wait=wait / queues)
    raise BackendConfigError(f"--backend: {settings.backend} is not available yet")
