"""Storage Queue helpers that need no server: error mapping, scrubbing, failed records."""

from __future__ import annotations

import base64
import json

import pytest

pytest.importorskip("azure.storage.queue")
pytestmark = pytest.mark.timeout(30)

from azure.core.exceptions import (  # noqa: E402
    ClientAuthenticationError,
    HttpResponseError,
    ResourceNotFoundError,
    ServiceRequestError,
    ServiceResponseError,
)

from supervisor.backends.azure_common import Scrubber, reset_for_requeue  # noqa: E402
from supervisor.backends.base import BackendConfigError, BackendError, LeaseLost  # noqa: E402
from supervisor.backends.common import poison_reason  # noqa: E402
from supervisor.backends.storage_queue.errors import (  # noqa: E402
    MessageGone,
    clamp_visibility,
    make_record,
    parse_record,
    translate,
)
from supervisor.core.task import MAX_BODY_BYTES, Task, TaskFormatError  # noqa: E402

KEY = "c2VjcmV0LWtleS1ub3QtcmVhbC0xMjM0NTY3ODkw"
CS = f"DefaultEndpointsProtocol=https;AccountName=acc;AccountKey={KEY};EndpointSuffix=x"


class _Response:
    def __init__(self, status: int, code: str) -> None:
        self.status_code = status
        self.headers = {"x-ms-error-code": code}
        self.reason = "reason"


def _http_error(cls, status: int, code: str):
    exc = cls(message=f"{code} happened", response=None)
    exc.response = _Response(status, code)
    exc.status_code = status
    exc.error_code = code
    return exc


@pytest.mark.parametrize("exc, lease, expected", [
    (_http_error(HttpResponseError, 400, "PopReceiptMismatch"), True, LeaseLost),
    (_http_error(ResourceNotFoundError, 404, "MessageNotFound"), True, MessageGone),
    (_http_error(ResourceNotFoundError, 404, "QueueNotFound"), True, LeaseLost),
    (_http_error(ResourceNotFoundError, 404, "QueueNotFound"), False, BackendError),
    (_http_error(ClientAuthenticationError, 403, "AuthenticationFailed"), True,
     BackendConfigError),
    (_http_error(HttpResponseError, 403, "AuthorizationPermissionMismatch"), False,
     BackendConfigError),
    (_http_error(HttpResponseError, 503, "ServerBusy"), True, BackendError),
    (_http_error(HttpResponseError, 500, "InternalError"), False, BackendError),
    (ServiceRequestError("connection refused"), True, BackendError),
    (ServiceResponseError("read timed out"), True, BackendError),
    (ConnectionResetError("reset"), False, BackendError),
])
def test_translate(exc, lease, expected):
    error = translate(exc, "op", Scrubber(CS, None), lease=lease)
    assert type(error) is expected
    assert str(error).startswith("op")


def test_translate_scrubs_secrets():
    exc = ServiceRequestError(f"could not connect with {CS}")
    text = str(translate(exc, "op", Scrubber(CS, None)))
    assert KEY not in text and "***" in text
    sas = "sv=2024-01-01&sig=abcdefghijklmnop"
    exc = ServiceRequestError(f"GET https://a.queue.core.windows.net/q?{sas} failed")
    assert sas not in str(translate(exc, "op", Scrubber(None, "https://a/q?" + sas)))
    long_message = "x" * 280 + KEY  # the secret straddles the cut at 300 characters
    assert KEY[:10] not in str(translate(ServiceRequestError(long_message), "op",
                                         Scrubber(CS, None)))


def test_clamp_visibility():
    assert clamp_visibility(0.2, 1) == 1
    assert clamp_visibility(0, 0) == 0
    assert clamp_visibility(-5, 0) == 0
    assert clamp_visibility(2.5, 0) == 3
    assert clamp_visibility(1e9, 0) == 604800
    assert clamp_visibility(float("inf"), 1) == 604800


def test_record_roundtrip_for_a_task():
    task = Task(cmd="exit 3", id="t1", env={"A": "b"}, preemptions=2)
    text = make_record(task.to_json(), task, "exit status 3", 4, 3, "out\n", "w1", "m1")
    record, body = parse_record(text, "m-failed")
    assert (record.id, record.attempts, record.exit_status, record.worker) == ("t1", 4, 3, "w1")
    assert record.command == "exit 3" and record.output_tail == "out\n"
    assert Task.parse(body) == task
    assert Task.parse(reset_for_requeue(body)).preemptions == 0


def test_record_of_a_poison_body_keeps_the_text():
    text = make_record("\ufffd\x01 not json", None, "bad", 1, None, "", "w", "m9")
    record, body = parse_record(text, "x")
    assert record.id == "m9" and body == "\ufffd\x01 not json" and record.command == ""
    assert text.isascii()  # nothing that could break the XML around a message


def test_record_trims_output_then_body_to_fit():
    task = Task(cmd="echo " + "x" * 30000, env={"E": "y" * 25000})
    tail = "\x1b[1m" * 20000 + "END"
    text = make_record(task.to_json(), task, "r" * 10000, 1, 1, tail, "w", "m")
    assert len(text) <= MAX_BODY_BYTES
    record, body = parse_record(text, "m")
    assert record.output_tail.endswith("END") and Task.parse(body) == task
    huge_poison = '"' * 64000
    text = make_record(huge_poison, None, "r", 1, None, "tail", "w", "m")
    assert len(text) <= MAX_BODY_BYTES
    record, body = parse_record(text, "m")
    assert body is None and record.body == ""  # truncated: shown, but never requeued
    assert json.loads(text)["body_truncated"] is True


def test_foreign_messages_in_the_failed_queue():
    record, body = parse_record("plain text", "m1")
    assert record.id == "m1" and body == "plain text"
    assert "not a jobq-supervisor" in record.reason


def test_poison_reason_hints():
    err = TaskFormatError("body is not JSON text")
    assert "not UTF-8" in poison_reason(err, "ab\ufffd")
    b64 = base64.b64encode(Task(cmd="true").to_json().encode()).decode()
    assert "base64" in poison_reason(err, b64)
    assert poison_reason(err, "abcd") == "body is not JSON text"


@pytest.mark.parametrize("name", ["q1", "ab", "Upper", "a--b", "-ab", "ab-", "a_b",
                                  "x" * 57])
def test_a_name_the_service_refuses_is_a_config_error_before_any_call(name) -> None:
    # The service answers 400 OutOfRangeInput, which a worker would retry for ever.
    from supervisor.backends.storage_queue.backend import StorageQueueBackend

    with pytest.raises(BackendConfigError, match="bad Storage Queue name"):
        StorageQueueBackend(name, connection_string="UseDevelopmentStorage=true")


@pytest.mark.parametrize("name", ["abc", "a-b", "jobs-1", "x" * 56])
def test_names_the_service_takes_pass(name) -> None:
    from supervisor.backends.storage_queue.backend import _QUEUE_NAME, FAILED_SUFFIX

    assert _QUEUE_NAME.match(name) and len(name) + len(FAILED_SUFFIX) <= 63


def test_failed_queue_names():
    """Issue 26 (5): the queues a push must not go to (jobq-ctl refuses them)."""
    from supervisor.backends.azure_common import failed_queue_of

    assert failed_queue_of("storage-queue", "jobs-failed") == "jobs"
    assert failed_queue_of("storage-queue", "jobs") is None
    assert failed_queue_of("storage-queue", "failed-jobs") is None
    assert failed_queue_of("servicebus", "jobs-failed") is None  # a plain Service Bus queue
    assert failed_queue_of("sqlite", "jobs-failed") is None  # failed tasks are rows there
