"""Issue 18 item 1 on Storage Queue (Azurite): a worker over two queues starts them in strict
or round-robin order, and each queue's failures go to its own ``-failed`` queue."""

from __future__ import annotations

import json
import signal

import pytest

from tests.azure_envs import SqEnv
from tests.conftest import wait_for, wait_for_no_marked

pytestmark = [pytest.mark.azure, pytest.mark.timeout(120)]


@pytest.fixture
def sq(tmp_path, azurite, queue_name):
    e = SqEnv(tmp_path, azurite.port, queue_name)
    for suffix in ("high", "low"):  # creates the queues, as any first writing command does
        e.ctl("--queue", f"{queue_name}-{suffix}", "clear")
    yield e
    e.cleanup()
    assert not wait_for_no_marked(timeout=10)


def fill(sq: SqEnv, n: int) -> None:
    order = sq.tmp / "order"
    for suffix in ("low", "high"):  # low first: FIFO alone would start it first
        args = ["--queue", f"{sq.queue}-{suffix}", "push"]
        for i in range(n):
            args += ["-c", f'echo "{suffix}{i} $JOBQ_QUEUE_NAME" >> {order}']
        sq.ctl(*args)


def started(sq: SqEnv) -> list[str]:
    pairs = [line.split() for line in (sq.tmp / "order").read_text().splitlines() if line]
    for name, queue in pairs:
        assert queue == f"{sq.queue}-{name.rstrip('0123456789')}", pairs
    return [name for name, _ in pairs]


def worker(sq: SqEnv, *args: str):
    return sq.supervisor("--queue", f"{sq.queue}-high,{sq.queue}-low", "-n", "1",
                         "--exit-when-empty", "--poll-interval", "0.3", "--control", "off",
                         *args)


def test_strict_starts_every_high_task_first(sq: SqEnv) -> None:
    fill(sq, 4)
    sup = worker(sq)
    assert sup.wait(100) == 0, sup.log()
    assert started(sq) == [f"high{i}" for i in range(4)] + [f"low{i}" for i in range(4)]


def test_round_robin_alternates(sq: SqEnv) -> None:
    fill(sq, 4)
    sup = worker(sq, "--queue-order", "round-robin")
    assert sup.wait(100) == 0, sup.log()
    assert started(sq) == [f"{q}{i}" for i in range(4) for q in ("high", "low")]


def test_failures_go_to_each_queues_own_failed_queue(sq: SqEnv) -> None:
    for suffix, rc in (("high", 3), ("low", 4)):
        sq.ctl("--queue", f"{sq.queue}-{suffix}", "push", "-c", f"exit {rc}")
    sup = worker(sq, "--max-attempts", "1", "-n", "2")
    assert sup.wait(100) == 4, sup.log()
    for suffix, rc in (("high", 3), ("low", 4)):
        records = json.loads(sq.ctl("--queue", f"{sq.queue}-{suffix}", "failed",
                                    "--json").stdout)
        assert [r["exit_status"] for r in records] == [rc], records


FAST = ("--control-interval", "0.5", "--heartbeat-interval", "1", "--poll-interval", "0.2")


def test_fleet_per_queue_on_table_storage(sq: SqEnv, table) -> None:
    """One worker record per queue, a paused queue skipped while the other goes on, a
    cancel through the second queue carried out."""
    store, control_env = table
    high, low = f"{sq.queue}-high", f"{sq.queue}-low"
    sq.ctl("--queue", high, "pause", env=control_env)
    done = sq.tmp / "done"
    sq.ctl("--queue", high, "push", "-c", f"touch {done}-high")
    [long] = sq.ctl("--queue", low, "push", "-c", f"touch {done}-low; sleep 60").stdout.split()
    sup = sq.supervisor("--queue", f"{high},{low}", "-n", "2", "--worker-id", "w-mq", *FAST,
                        env=control_env)
    wait_for(lambda: (sq.tmp / "done-low").exists(), 30, what="the low task to start")
    wait_for(lambda: [t.id for w in store.workers(low) for t in w.tasks] == [long], 15,
             what="the low queue's record with its task")
    [rec_high] = store.workers(high)
    assert rec_high.id == "w-mq" and rec_high.tasks == () and rec_high.state == "paused"
    assert not (sq.tmp / "done-high").exists(), "a paused queue is skipped"
    sq.ctl("--queue", low, "cancel", long, "--grace", "0", env=control_env)
    wait_for(lambda: len(json.loads(sq.ctl("--queue", low, "failed", "--json").stdout)) == 1,
             30, what="the cancelled task in low's failed queue")
    sq.ctl("--queue", high, "resume", env=control_env)
    wait_for(lambda: (sq.tmp / "done-high").exists(), 30, what="the high task after resume")
    sup.signal(signal.SIGTERM)
    assert sup.wait(30) == 0, sup.log()
    assert not store.workers(high) and not store.workers(low), "records deleted at exit"
