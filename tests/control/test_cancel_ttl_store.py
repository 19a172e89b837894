"""``--cancel-ttl`` in the stores and in jobq-ctl: purge deletes a cancel past its own ttl (one
without a ttl at 7 days, as before), on both stores in the same one purge call; ``jobq-ctl
cancel`` records the ttl it is given and none for the default."""

from __future__ import annotations

import uuid

import pytest

from supervisor.fleet.control import Cancel
from supervisor.fleet.control.base import DAY
from supervisor.fleet.control.records import CANCEL_TTL
from tests.control.conftest import azure_ctl

from .conftest import QUEUE, Kit, table_connection_string

NOW = 1_700_000_000.0


def cancel(task_id: str, when: float, ttl: float | None = None) -> Cancel:
    return Cancel(queue=QUEUE, task_id=task_id, reason="r", who="ops", when=when, ttl=ttl)


def test_purge_deletes_each_cancel_at_its_own_ttl(kit: Kit) -> None:
    s = kit.store
    s.put_cancel(cancel("short-expired", NOW - 61, ttl=60))
    s.put_cancel(cancel("short-live", NOW - 59, ttl=60))
    s.put_cancel(cancel("plain-expired", NOW - CANCEL_TTL - 1))
    s.put_cancel(cancel("plain-live", NOW - 6 * DAY))
    kit.calls.clear()
    counts = s.purge(NOW)
    if kit.kind == "azure":  # still one query (plus one delete per purged record)
        assert [c.split()[0] for c in kit.calls] == ["GET", "DELETE", "DELETE"], kit.calls
    assert counts.cancels == 2
    assert sorted(c.task_id for c in s.cancels(QUEUE)) == ["plain-live", "short-live"]
    assert s.purge(NOW + 60).cancels == 1  # short-live's turn
    assert [c.task_id for c in s.cancels(QUEUE)] == ["plain-live"]


@pytest.mark.azure
def test_ctl_cancel_records_the_ttl_it_is_given(azurite_table) -> None:
    from supervisor.fleet.control.azure_table import AzureTableControlStore

    conn = table_connection_string(azurite_table)
    queue = "q" + uuid.uuid4().hex[:12]
    store = AzureTableControlStore(connection_string=conn)
    try:
        for task_id, extra in (("a", ("--cancel-ttl", "90s")), ("b", ()),
                               ("c", ("--cancel-ttl", "7d"))):
            res = azure_ctl(conn, queue, "cancel", task_id, "--any-id", *extra)
            assert res.returncode == 0, res.stderr
        ttls = {c.task_id: c.ttl for c in store.cancels(queue)}
        assert ttls == {"a": 90.0, "b": None, "c": None}
        (a,) = [c for c in store.cancels(queue) if c.task_id == "a"]
        assert a.expires() == a.when + 90
    finally:
        store.close()
