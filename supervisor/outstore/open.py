"""Which output store a worker or ``jobq-ctl`` uses, from its Settings (main thread).

The output store lives beside the control store (control/open.py): a SQLite queue's in files
beside its database (files.py); an Azure control store's in blob container
``--task-log-container`` of the same storage account (azure_blob.py).  No control store, no
output store.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Union

from .base import OutputStore

if TYPE_CHECKING:
    from ..settings import Settings


def open_output_store(settings: Settings, create: bool = True) -> Union[OutputStore, None]:
    """The output store these settings name, or None (main thread; raises OutputConfigError
    for a configuration that can never work).  ``create=False``: nothing is created."""
    if settings.control == "off":
        return None
    if settings.backend == "sqlite" and not (settings.control_account_url
                                             or settings.control_connection_string):
        from .files import FileOutputStore, output_dir

        return FileOutputStore(output_dir(settings.sqlite_path))
    return None  # Azure: azure_blob.py (next slice)
