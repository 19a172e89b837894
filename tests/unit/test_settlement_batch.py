"""Completing a turn's succeeded tasks together (Backend.complete_many, PostgreSQL's
``batch_complete``) on the completer's thread (worker/completer.py): one backend call for
them all, no keeper thread for a lease it completed, a refused lease counted lost -- just
that one -- and a lease the call did not complete handed to its keeper thread, which tries
again.  The database side (one fenced
UPDATE): tests/postgres/test_queue_postgres.py."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from test_settlement import SETTLED_WITHIN, Harness, settled

from supervisor.backends.base import BackendError, Lease, LeaseLost
from supervisor.worker.completer import Completer
from supervisor.worker.outcomes import Unsettled
from tests.conftest import wait_for
from tests.fakes.backend import FakeBackend

pytestmark = pytest.mark.timeout(30)


class BatchBackend(FakeBackend):
    """Completes a batch lease by lease (BackendBase's way), recording each batch; a lease
    in ``not_done`` gets a BackendError without a call."""

    batch_complete = True

    def __init__(self) -> None:
        super().__init__()
        self.batches: list[list[Lease]] = []
        self.not_done: set[int] = set()

    def complete_many(self, leases: Sequence[Lease]) -> list[BaseException | None]:
        self.batches.append(list(leases))
        errors: list[BaseException | None] = []
        for lease in leases:
            if id(lease) in self.not_done:
                errors.append(BackendError("PostgreSQL: complete: timed out"))
            else:
                errors += super().complete_many([lease])
        return errors


def batch_harness() -> tuple[Harness, BatchBackend]:
    h = Harness()
    backend = BatchBackend()
    h.settlement.backend, h.settlement.batch_complete = backend, True
    h.settlement.completer = Completer(backend)
    return h, backend


def test_the_succeeded_tasks_of_a_turn_complete_in_one_call() -> None:
    h, backend = batch_harness()
    ok, refused, timed_out, failed = (h.finished(0), h.finished(0), h.finished(0),
                                      h.finished(1))
    refused.keeper.lease.refuse = LeaseLost("lease (attempt 1) no longer held")
    backend.not_done.add(id(timed_out.keeper.lease))
    for rt in (ok, refused, timed_out, failed):
        h.settlement.conclude(rt, h.clock.now, stopping=False)
    # nothing completed before the turn's flush; the failed one is retried as before
    assert backend.batches == [] and ok.keeper.lease.calls == []
    assert settled(failed.keeper) == [("release", True, 10.0)]
    h.settlement.flush()
    assert ok.keeper.join(SETTLED_WITHIN) and refused.keeper.join(SETTLED_WITHIN)
    assert backend.batches == [[ok.keeper.lease, refused.keeper.lease, timed_out.keeper.lease]]
    # completed on the completer's thread: no keeper thread
    assert ok.keeper.result is not None and ok.keeper.result.unsettled is None
    assert ok.keeper.lease.calls == [("complete",)]
    # refused: just that lease is lost
    assert refused.keeper.result is not None
    assert refused.keeper.result.unsettled is Unsettled.REFUSED
    # not done: handed back, and the next prune starts its keeper thread, which completes it
    assert wait_for(lambda: (h.settlement.prune(), timed_out.keeper.started)[1], SETTLED_WITHIN)
    assert settled(timed_out.keeper) == [("complete",)]
    h.settlement.prune()
    assert h.settlement.settling == []
    assert h.settlement.counts == h.counts(succeeded=2, lock_lost=1, retried=1)
    h.settlement.flush()  # nothing gathered: no call
    h.settlement.completer.stop()
    assert len(backend.batches) == 1


def test_a_lease_past_its_deadline_is_not_completed_in_the_batch() -> None:
    """The deadline passed between the shell's exit and the flush: no call for it (the
    broker hands the message out again); its neighbour completes."""
    h, backend = batch_harness()
    late, ok = h.finished(0, granted=60.0), h.finished(0, granted=2700.0)
    for rt in (late, ok):
        h.settlement.conclude(rt, h.clock.now, stopping=False)
    h.clock.advance(60.0)
    h.settlement.flush()
    assert ok.keeper.join(SETTLED_WITHIN)
    assert backend.batches == [[ok.keeper.lease]]
    assert wait_for(lambda: (h.settlement.prune(), late.keeper.started)[1], SETTLED_WITHIN)
    assert settled(late.keeper) == []
    assert late.keeper.result is not None and late.keeper.result.unsettled is not None
