"""The bench's call counter (scripts/bench_calls.py): requests found in a keep-alive byte
stream cut anywhere, bodies skipped by Content-Length, and each classified by its REST shape."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

from bench_calls import _Stream, classify  # noqa: E402


def test_requests_are_found_in_a_stream_cut_anywhere():
    body = b"<QueueMessage><MessageText>GET /x HTTP/1.1\r\n\r\n</MessageText></QueueMessage>"
    data = (b"POST /devstoreaccount1/q/messages HTTP/1.1\r\nHost: h\r\nContent-Length: "
            + str(len(body)).encode() + b"\r\n\r\n" + body
            + b"GET /devstoreaccount1/q/messages?numofmessages=32 HTTP/1.1\r\nHost: h\r\n\r\n"
            + b"DELETE /devstoreaccount1/q/messages/id1?popreceipt=p HTTP/1.1\r\n\r\n")
    for cut in (1, 7, 50, len(data)):
        seen: list[tuple[str, str]] = []
        stream = _Stream(lambda m, t, seen=seen: seen.append((m, t)))
        for i in range(0, len(data), cut):
            stream.feed(data[i:i + cut])
        assert [classify("queue", m, t) for m, t in seen] == [
            "queue put", "queue receive", "queue delete"], cut


def test_classify():
    q = "/devstoreaccount1/jobs"
    assert classify("queue", "PUT", q) == "queue create"
    assert classify("queue", "GET", q + "?comp=metadata") == "queue properties"
    assert classify("queue", "GET", q + "/messages?peekonly=true") == "queue peek"
    assert classify("queue", "PUT", q + "/messages/m1?popreceipt=x&visibilitytimeout=60") \
        == "queue renew/release"
    t = "/devstoreaccount1/jobqcontrol"
    assert classify("table", "POST", "/devstoreaccount1/Tables") == "table create"
    assert classify("table", "GET", t + "()?$filter=PartitionKey%20eq%20'q'") == "table query"
    assert classify("table", "PUT", t + "(PartitionKey='w',RowKey='r')") == "table upsert"
    assert classify("table", "POST", "/devstoreaccount1/$batch") == "table batch"
