"""The wake-up listener (supervisor/backends/postgres/listener.py) on a real server: a NOTIFY
sets its queue's flag, a restart is reconnected and counts as a change, closing it ends its
thread and its connection, and the queues of one worker share one listener."""

from __future__ import annotations

import threading
import time

import psycopg
import pytest

from supervisor.backends.postgres import listener as listener_mod
from supervisor.backends.postgres.connect import APP_WORKER, connect, one_line
from supervisor.backends.postgres.listener import WakeListener
from tests.postgres.faults import frozen

CHANNEL = "jobq.wake"


def make(url: str, **kw) -> WakeListener:
    return WakeListener(lambda: connect(url, application_name=APP_WORKER), CHANNEL,
                        describe=lambda exc: one_line(exc, url), **kw)


def notify(url: str, queue: str, channel: str = CHANNEL) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SELECT pg_notify(%s, %s)", (channel, queue))


def wait_for(predicate, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.005)
    return False


def listening_backends(url: str) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        return conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND "
            "query LIKE 'LISTEN %%' AND pid <> pg_backend_pid()").fetchone()[0]


@pytest.fixture
def listener(pg_url):
    lst = make(pg_url)
    lst.watch("q")
    lst.start()
    try:
        assert lst.listening.wait(10)
        assert lst.changed("q")  # the first LISTEN counts as a change
        yield lst
    finally:
        lst.close()


def test_a_notify_sets_its_queues_flag_once(pg_url, listener):
    assert not listener.changed("q")
    notify(pg_url, "other")  # a queue this worker does not serve: no flag, nothing kept
    notify(pg_url, "q")
    assert wait_for(lambda: listener.changed("q"), 5)
    assert not listener.changed("q")  # taken
    assert not listener.changed("other")
    notify(pg_url, "q", channel="otherschema.wake")  # another schema's channel
    time.sleep(0.2)
    assert not listener.changed("q")


def test_after_a_server_restart_it_listens_again_and_counts_that_as_a_change(
        pg_server, pg_url, listener, caplog):
    assert listener.connects == 1
    pg_server.restart()
    assert wait_for(lambda: listener.connects == 2, 30), "the listener did not reconnect"
    assert listener.changed("q")  # a NOTIFY may have been lost meanwhile
    notify(pg_url, "q")
    assert wait_for(lambda: listener.changed("q"), 5)
    assert "pg-test-s3cret" not in caplog.text


def test_a_server_down_for_a_while_is_retried_with_back_off(pg_server, pg_url, listener,
                                                            caplog):
    pg_server.stop()
    assert wait_for(lambda: not listener.listening.is_set(), 10)
    time.sleep(1.0)  # failed reconnects meanwhile
    assert not listener.changed("q")  # down: the probe says nothing new, the poll goes on
    pg_server.start()
    assert wait_for(lambda: listener.listening.is_set(), 30)
    assert listener.changed("q")
    assert "PostgreSQL wake-up listener unavailable" in caplog.text
    assert "pg-test-s3cret" not in caplog.text


def test_close_ends_the_thread_and_its_connection(pg_url):
    lst = make(pg_url)
    lst.watch("q")
    lst.start()
    assert lst.listening.wait(10)
    assert listening_backends(pg_url) == 1
    lst.close()  # the pipe wakes the thread: it is gone when close returns
    assert not any(t.name == "pg-wake-listener" and t.is_alive()
                   for t in threading.enumerate())
    assert wait_for(lambda: listening_backends(pg_url) == 0, 5)


def test_the_queues_of_a_worker_share_one_listener(pg_url):
    key = (pg_url, CHANNEL)
    first = listener_mod.acquire(key, "a", lambda: make(pg_url))
    try:
        second = listener_mod.acquire(key, "b", lambda: make(pg_url))
        assert second is first
        assert first.listening.wait(10)
        assert listening_backends(pg_url) == 1
        first.changed("a"), first.changed("b")
        notify(pg_url, "b")
        assert wait_for(lambda: first.changed("b"), 5)
        assert not first.changed("a")
        listener_mod.release(key, "a")
        assert first.listening.is_set()  # b still listens
    finally:
        listener_mod.release(key, "a")
        listener_mod.release(key, "b")
    assert key not in listener_mod._shared
    assert wait_for(lambda: listening_backends(pg_url) == 0, 5)


def test_a_worker_listens_and_jobq_ctl_or_notify_off_never_does(pg_url, close_at_end):
    """A worker's backend probes for changes through the listener and a push wakes it;
    ``jobq-ctl`` (for_ctl) and ``--postgres-notify off`` open no LISTEN connection and have
    no change probe (poll only)."""
    from supervisor.core.task import Task
    from tests.postgres.queue import open_queue

    ctl = close_at_end(open_queue(pg_url, "q", for_ctl=True))
    off = close_at_end(open_queue(pg_url, "q", "w2", postgres_notify="off"))
    assert not ctl.change_probe and not off.change_probe
    assert listening_backends(pg_url) == 0
    worker = close_at_end(open_queue(pg_url, "q", "w1"))
    woken = threading.Event()
    worker.wake_with(woken.set)
    assert worker.change_probe
    assert wait_for(lambda: listening_backends(pg_url) == 1)
    assert wait_for(worker.changed)  # the first LISTEN
    woken.clear()
    ctl.push([Task(cmd="true")])
    assert woken.wait(5) and worker.changed() and not worker.changed()
    worker.close()
    assert wait_for(lambda: listening_backends(pg_url) == 0, 5)


def test_the_worker_is_woken_once_until_it_asks(pg_url, listener):
    """A worker with no free slot asks no probe: the pushes meanwhile wake it once, not at
    each one; once it asked, the next push wakes it again."""
    wakes: list[str] = []
    listener.watch("z")  # a second queue of the worker: its NOTIFY comes after the five
    listener.changed("z")
    listener.wake = lambda: wakes.append("woken")
    for _ in range(5):
        notify(pg_url, "q")
    notify(pg_url, "z")
    assert wait_for(lambda: listener.changed("z"), 5)  # the five came before it, in order
    assert wakes == ["woken", "woken"]  # once for q, once for z
    assert listener.changed("q") and not listener.changed("q")
    wakes.clear()
    notify(pg_url, "q")
    assert wait_for(lambda: wakes == ["woken"], 5)


@pytest.mark.timeout(120)
def test_a_frozen_server_is_noticed_by_the_keep_alive_and_listened_to_again(
        pg_server, pg_url, caplog):
    """SIGSTOP of the server (the kernel still acknowledges, so no TCP timeout fires): the
    keep-alive SELECT 1 is cut at its client-side deadline, the listener says it is down
    (the worker polls), and once the server answers again it LISTENs anew."""
    lst = make(pg_url, ping_every=0.5, ping_timeout=1.0)
    lst.watch("q")
    lst.start()
    try:
        assert lst.listening.wait(10)
        assert lst.changed("q")
        with frozen(pg_server):
            gone = wait_for(lambda: not lst.listening.is_set(), 15)
            assert gone, "the keep-alive hung on the frozen server"
            assert not lst.changed("q")
        assert wait_for(lambda: lst.connects == 2 and lst.listening.is_set(), 60), \
            "the listener did not LISTEN again after the thaw"
        assert lst.changed("q")  # a NOTIFY may have been lost meanwhile
        notify(pg_url, "q")
        assert wait_for(lambda: lst.changed("q"), 10)
        assert "no answer from the server in time" in caplog.text
        assert "pg-test-s3cret" not in caplog.text
    finally:
        lst.close()
    assert not any(t.name == "pg-wake-listener" and t.is_alive()
                   for t in threading.enumerate())
