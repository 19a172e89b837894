"""Names the tests under tests/azure import from here.

The session's Azurite services (``azurite``, ``azurite_table``, ``azurite_blob``) and
``queue_name`` are fixtures of tests/conftest.py: one of each per test session, however many
modules use them.
"""

from __future__ import annotations

from tests.azurite import (  # noqa: F401 (re-exported)
    ACCOUNT,
    ACCOUNT_KEY,
    Azurite,
    azurite_service,
    free_port,
    session_service,
)
