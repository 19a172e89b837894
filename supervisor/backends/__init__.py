"""Queue backends behind the Backend/Lease seam (see base.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .base import Backend, BackendConfigError

if TYPE_CHECKING:
    from ..settings import Settings


def open_backend(settings: Settings, for_ctl: bool = False, create: bool = True) -> Backend:
    """Construct the configured backend (main thread).  Raises BackendConfigError/BackendError.

    ``create=False`` (the read-only ``jobq-ctl`` commands): create no database or queue; one
    that does not exist is a BackendError, so a mistyped name is visible instead of "0"."""
    if settings.backend == "sqlite":
        from .sqlite import CTL_BUSY_TIMEOUT, MAIN_BUSY_TIMEOUT, SqliteBackend

        return SqliteBackend(
            settings.sqlite_path,
            settings.queue,
            settings.worker_id,
            max_attempts=settings.max_attempts,
            stale_lock_age=settings.stale_age,
            reaper_interval=settings.reaper_interval,
            busy_timeout=CTL_BUSY_TIMEOUT if for_ctl else MAIN_BUSY_TIMEOUT,
            create=create,
        )
    if settings.backend == "storage-queue":
        from .storage_queue import StorageQueueBackend

        if settings.namespace:
            raise BackendConfigError("--namespace: only for --backend servicebus")
        return StorageQueueBackend(
            settings.queue,
            connection_string=settings.connection_string,
            account_url=settings.account_url,
            worker_id=settings.worker_id,
            # The main thread receives: a hung call must not hold up signal handling long.
            connect_timeout=3.0,
            read_timeout=5.0,
            create=create,
        )
    if settings.backend == "servicebus":
        from .servicebus import ServiceBusBackend

        if settings.account_url:
            raise BackendConfigError("--account-url: only for --backend storage-queue")
        return ServiceBusBackend(
            settings.queue,
            connection_string=settings.connection_string,
            namespace=settings.namespace,
            worker_id=settings.worker_id,
            lock_duration=settings.lock,
            receivers=0 if for_ctl else settings.num_workers,
            receive_wait=min(1.0, settings.poll_interval),
        )
    raise BackendConfigError(f"--backend: {settings.backend} is not available yet")
