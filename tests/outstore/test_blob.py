"""The append-blob output store beyond the contract (Azurite's blob service): rollover,
block splitting, retry safety, no creation for readers, no secrets, bounded failures."""

from __future__ import annotations

import math
import random
import socket
import time
from typing import Any

import pytest
from azure.core.exceptions import ServiceRequestError, ServiceResponseError

from supervisor.fleet.output.base import AttemptKey, OutputConfigError, OutputStoreError
from tests.azurite import free_port
from tests.outstore.conftest import (
    ACCOUNT,
    ACCOUNT_KEY,
    blob_connection_string,
    read_all,
    wait_until,
)

pytestmark = [pytest.mark.azure, pytest.mark.timeout(60)]
KEY = AttemptKey("jobs", "t-1", 1)


class LoseResponses:
    """A response hook that makes the SDK call fail after the service answered the chosen
    append requests (1-based): the bytes landed, the caller never hears so."""

    def __init__(self, *lose: int) -> None:
        self.lose, self.appends, self.statuses = set(lose), 0, []  # type: ignore[var-annotated]

    def __call__(self, response: Any) -> None:
        if "comp=appendblock" not in response.http_request.url:
            return
        self.appends += 1
        self.statuses.append(response.http_response.status_code)
        if self.appends in self.lose:
            raise ServiceResponseError("connection reset (test)")


def _names(blob_store) -> list[str]:
    return sorted(b.name for b in blob_store.raw.list_blobs())


def test_rollover_keeps_one_stream_per_attempt(blob_store):
    store = blob_store(max_block=4, max_blocks=3)  # 12 bytes a part
    rng = random.Random(7)
    data = {1: b"", 2: b""}
    for _ in range(30):
        attempt = rng.choice((1, 2))
        piece = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 9)))
        store.append(AttemptKey("jobs", "t-1", attempt), piece)
        data[attempt] += piece
    store.finish(AttemptKey("jobs", "t-1", 1))
    names = _names(blob_store)
    assert "jobs/t-1/1.log.2" in names and "jobs/t-1/2.log.1" in names, names
    assert store.attempts("jobs", "t-1") == [1, 2]
    for attempt, expected in data.items():
        key = AttemptKey("jobs", "t-1", attempt)
        for limit in (1, 5, 13, 1000):
            assert read_all(store, key, limit) == (expected, attempt == 1)
        assert store.read(key, 10, 20).data == expected[10:30]
        assert not store.read(key, 0, len(expected) - 1).complete
    # Another instance (a new process) continues where the output ends.
    again = blob_store(max_block=4, max_blocks=3)
    again.append(AttemptKey("jobs", "t-1", 2), b"tail")
    assert read_all(again, AttemptKey("jobs", "t-1", 2))[0] == data[2] + b"tail"


def test_an_append_over_4_mib_is_split_into_blocks(blob_store):
    store = blob_store()
    data = bytes(range(256)) * (9 * 4096)  # 9 MiB
    store.append(KEY, data)
    props = blob_store.raw.get_blob_client("jobs/t-1/1.log").get_blob_properties()
    assert (props.size, props.append_blob_committed_block_count) == (len(data), 3)
    assert read_all(store, KEY, 4 << 20)[0] == data


def test_a_lost_response_is_not_stored_twice(blob_store):
    hook = LoseResponses()
    store = blob_store(client_options={"raw_response_hook": hook})
    store.append(KEY, b"zero\n")
    hook.appends, hook.lose, hook.statuses = 0, {1}, []
    with pytest.raises(OutputStoreError):
        store.append(KEY, b"one\n")
    store.append(KEY, b"one\n")  # the caller's retry: same bytes, same expected position
    store.append(KEY, b"two\n")
    assert read_all(store, KEY)[0] == b"zero\none\ntwo\n"
    assert hook.statuses == [201, 412, 201]  # the retry was told the bytes were there


def test_a_retry_resumes_after_the_blocks_that_landed(blob_store):
    hook = LoseResponses(2)
    store = blob_store(max_block=4, client_options={"raw_response_hook": hook})
    with pytest.raises(OutputStoreError):
        store.append(KEY, b"aaaabbbbcccc")  # a, b land; b's answer is lost; c not sent
    store.append(KEY, b"aaaabbbbcccc")
    assert read_all(store, KEY)[0] == b"aaaabbbbcccc"
    assert hook.statuses == [201, 201, 412, 201]
    # Bytes given up on (the caller appends a marker instead) stay where they landed.
    hook.appends, hook.lose = 0, {1}
    with pytest.raises(OutputStoreError):
        store.append(KEY, b"dddd")  # as long as a block of what follows: no mix-up
    store.append(KEY, b"[dropped]")
    assert read_all(store, KEY)[0] == b"aaaabbbbccccdddd[dropped]"


def test_readers_never_create_the_container(blob_store):
    reader = blob_store(create=False)
    assert reader.read(KEY).data == b"" and not reader.read(KEY).complete
    assert reader.attempts("jobs", "t-1") == [] and reader.purge(time.time()) == 0
    with pytest.raises(OutputStoreError):
        reader.append(KEY, b"x")
    with pytest.raises(OutputStoreError):
        reader.finish(KEY)
    assert not blob_store.raw.exists()
    blob_store().finish(KEY)  # a writer creates it
    assert blob_store.raw.exists() and reader.read(KEY).complete


def test_purge_pages_through_the_container_in_bounded_steps(blob_store):
    store = blob_store(max_block=2, max_blocks=1, page_size=3, purge_max=2)
    for t in range(4):
        store.append(AttemptKey("jobs", f"old-{t}", 1), b"aabbcc")  # 3 parts each
    before = math.ceil(time.time() + 0.001)
    wait_until(before + 0.05)
    store.append(AttemptKey("jobs", "new", 1), b"aabbcc")
    store.append(AttemptKey("jobs", "old-0", 2), b"a")
    counts = []
    for _ in range(12):
        counts.append(store.purge(before))
    assert sum(counts) == 4 and max(counts) <= 2, counts
    assert _names(blob_store) == ["jobs/new/1.log", "jobs/new/1.log.1", "jobs/new/1.log.2",
                                  "jobs/old-0/2.log"]


def test_errors_name_no_secret(blob_store, azurite_blob):
    wrong = "d3Jvbmcga2V5IHdyb25nIGtleSB3cm9uZyBrZXkgd3Jvbmcga2V5IHdyb25nIGtleQ=="
    store = blob_store(connection_string=blob_connection_string(azurite_blob, key=wrong))
    with pytest.raises(OutputConfigError) as err:
        store.append(KEY, b"x")
    assert wrong not in str(err.value) and "\n" not in str(err.value)
    # Transports have put the request's URL (with its SAS) in their messages.
    sig = "Zm9vYmFyYmF6%2Bqux%3D"
    # (a parameter that is not the SAS's: the SDK's URL holds the SAS, not the query as given)
    url = f"http://127.0.0.1:{free_port()}/{ACCOUNT}?sv=2021-08-06&x=1&sp=rwdlac&sig={sig}"

    def leak(request: Any) -> None:
        raise ServiceRequestError(f"Max retries exceeded with url: {request.http_request.url}"
                                  f"\n(caused by a test)")

    store = blob_store(connection_string=None, account_url=url,
                       client_options={"raw_request_hook": leak})
    with pytest.raises(OutputStoreError) as err:
        store.read(KEY)
    text = str(err.value)
    assert "Max retries" in text and "sig=***" in text, text
    assert "Zm9vYmFyYmF6" not in text and "\n" not in text and ACCOUNT_KEY not in text


def test_an_unreachable_store_fails_within_seconds(blob_store):
    closed = blob_store(connection_string=blob_connection_string(free_port()))
    started = time.monotonic()
    with pytest.raises(OutputStoreError):
        closed.append(KEY, b"x")
    assert time.monotonic() - started < 10.0
    with socket.socket() as hole:  # accepts connections, never answers
        hole.bind(("127.0.0.1", 0))
        hole.listen(8)
        silent = blob_store(connection_string=blob_connection_string(hole.getsockname()[1]),
                            read_timeout=2.0)
        started = time.monotonic()
        with pytest.raises(OutputStoreError):
            silent.read(KEY)
        assert time.monotonic() - started < 8.0  # one try: no SDK retries


def test_calls_per_attempt(blob_store):
    calls: list[str] = []
    store = blob_store(client_options={"raw_request_hook": lambda r: calls.append(
        f"{r.http_request.method} {r.http_request.url.split('?')[-1]}")})
    store.finish(AttemptKey("jobs", "warm-up", 1))  # creates the container
    calls.clear()
    store.append(KEY, b"a")
    assert len(calls) == 2, calls  # create the blob, append
    store.append(KEY, b"b")
    store.finish(KEY)
    assert len(calls) == 4, calls  # one append, one metadata write
    calls.clear()
    assert store.read(KEY).data == b"ab" and len(calls) == 2, calls  # list, download


def test_reopen_costs_the_create_of_a_new_attempt_and_clears_complete_on_the_last_part(
        blob_store):
    calls: list[str] = []
    store = blob_store(max_block=4, max_blocks=2, client_options={  # 8 bytes a part
        "raw_request_hook": lambda r: calls.append(r.http_request.method)})
    store.finish(AttemptKey("jobs", "warm-up", 1))  # creates the container
    calls.clear()
    assert store.reopen(KEY) == 0
    store.append(KEY, b"0123456789abc")  # 13 bytes: parts 0 and 1
    assert len(calls) == 6, calls  # create (reopen), 2 blocks, create part 1, 2 blocks
    store.finish(KEY)
    assert "jobs/t-1/1.log.1" in _names(blob_store)
    again = blob_store(max_block=4, max_blocks=2)  # the next run: another worker
    assert again.reopen(KEY) == 13
    assert not again.read(KEY, 13).complete
    again.append(KEY, b"XYZ")
    again.finish(KEY)
    assert read_all(store, KEY, 5) == (b"0123456789abcXYZ", True)
