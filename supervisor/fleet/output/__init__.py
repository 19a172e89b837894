"""The output store: every attempt's output, readable from any machine that reaches the queue.

See base.py for the seam, files.py (SQLite queues) and fleet/output/azure_blob.py (Azure) for the
stores,
and docs/architecture.rst, "Task output".
"""

from .base import AttemptKey, Chunk, OutputStore, OutputStoreError

__all__ = ["AttemptKey", "Chunk", "OutputStore", "OutputStoreError"]
