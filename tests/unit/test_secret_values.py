"""Issue 39 (4): credentials found by value (core/secret_values.py), the managed-identity
names, and the filter and mask that use both (core/secret_names.py, dashboard/data.py)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from supervisor.core.secret_names import is_secret, is_secret_name, without_secrets
from supervisor.core.secret_values import is_secret_value, redact
from supervisor.dashboard.data import MASK, masked

pytestmark = pytest.mark.timeout(30)

# (value, what redact leaves of it)
SECRET_VALUES = [
    # the issue's: what a task saw
    ("postgres://app:SECRET@db.example:5432/app", "postgres://app:***@db.example:5432/app"),
    ("http://user:SECRET@proxy.example:3128", "http://user:***@proxy.example:3128"),
    ("https://0123456789abcdef0123456789abcdef@o1.ingest.sentry.io/42",
     "https://***@o1.ingest.sentry.io/42"),
    ("DefaultEndpointsProtocol=https;AccountName=acct;AccountKey=SECRET==;"
     "EndpointSuffix=core.windows.net",
     "DefaultEndpointsProtocol=https;AccountName=acct;AccountKey=***;"
     "EndpointSuffix=core.windows.net"),
    # the other forms of the same
    ("redis://:SECRET@cache:6379/0", "redis://:***@cache:6379/0"),
    ("amqps://u:S%40CRET@mq/vhost", "amqps://u:***@mq/vhost"),
    ("Endpoint=sb://ns.servicebus.windows.net/;SharedAccessKeyName=send;SharedAccessKey=SECRET=",
     "Endpoint=sb://ns.servicebus.windows.net/;SharedAccessKeyName=send;SharedAccessKey=***"),
    ("BlobEndpoint=https://a.blob.core.windows.net/;SharedAccessSignature=sv=2022&sig=SECRET",
     "BlobEndpoint=https://a.blob.core.windows.net/;SharedAccessSignature=***"),
    ("https://a.blob.core.windows.net/c/b?sv=2022-11-02&se=2030&sig=SE%2FCRET&sp=r",
     "https://a.blob.core.windows.net/c/b?sv=2022-11-02&se=2030&sig=***&sp=r"),
    ("sv=2022-11-02&ss=q&sig=SECRET", "sv=2022-11-02&ss=q&sig=***"),
    ("host=db user=jobq password=SECRET dbname=q", "host=db user=jobq password=*** dbname=q"),
    ("host=db password='SE CRET' dbname=q", "host=db password=*** dbname=q"),
    ("accountkey=SECRET", "accountkey=***"),
]
PLAIN_VALUES = [
    "/usr/local/bin:/usr/bin:/bin", "https://example.com/path?q=1&page=2",
    "http://proxy.example:3128", "ssh://git@github.com/org/repo.git", "git@github.com:org/x",
    "http://host:8080/a@b", "mailto:someone@example.com", "user@example.com", "en_US.UTF-8",
    "AccountName=acct;QueueEndpoint=https://acct.queue.core.windows.net", "design=1",
    "--signature-file=/etc/x", "", "1", "C:\\Users\\x",
]


@pytest.mark.parametrize(("value", "shown"), SECRET_VALUES)
def test_secret_values_are_found_and_cut_out(value, shown):
    assert is_secret_value(value)
    assert redact(value) == shown
    assert "SECRET" not in redact(value) and "SE CRET" not in redact(value)


@pytest.mark.parametrize("value", PLAIN_VALUES)
def test_plain_values_are_left_alone(value):
    assert not is_secret_value(value)
    assert redact(value) == value


def test_same_length_keeps_every_character_but_the_secret():
    """What the argv wipe writes: each argument keeps its length (core/argv_secrets.py)."""
    value = "postgresql://jobq:PASSWORD@db/q"
    assert redact(value, same_length=True) == "postgresql://jobq:********@db/q"


@given(st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=40))
def test_redact_never_leaves_a_secret(text):
    once = redact(text)
    assert redact(once) == once  # what is left holds no credential any more
    assert len(redact(text, same_length=True)) == len(text)


@pytest.mark.parametrize("name", [
    "IDENTITY_HEADER", "MSI_SECRET", "SENTRY_DSN", "HTTP_AUTHORIZATION", "AZURE_CLIENT_SECRET",
    "AZURE_FEDERATED_TOKEN_FILE", "ACTIONS_ID_TOKEN_REQUEST_TOKEN"])
def test_managed_identity_and_dsn_names(name):
    assert is_secret_name(name)


@pytest.mark.parametrize("name", ["IDENTITY_ENDPOINT", "MSI_ENDPOINT", "AZURE_CLIENT_ID",
                                  "HTTPS_PROXY", "DATABASE_URL"])
def test_names_that_say_no_secret(name):
    assert not is_secret_name(name)


def test_the_filter_goes_by_value_and_pass_env_still_lets_a_name_through():
    env = {"DATABASE_URL": "postgres://app:SECRET@db/app",
           "HTTPS_PROXY": "http://user:SECRET@proxy:3128", "http_proxy": "http://proxy:3128",
           "STORAGE_CONN": "AccountName=a;AccountKey=SECRET", "IDENTITY_HEADER": "SECRET",
           "SENTRY_DSN": "https://SECRET@o1.ingest.sentry.io/1", "HOME": "/root"}
    assert without_secrets(env) == {"http_proxy": "http://proxy:3128", "HOME": "/root"}
    assert without_secrets(env, ("HTTPS_PROXY",)) == {
        "HTTPS_PROXY": "http://user:SECRET@proxy:3128", "http_proxy": "http://proxy:3128",
        "HOME": "/root"}
    assert is_secret("X", "AccountKey=k") and not is_secret("X", "y")


def test_the_dashboard_masks_by_value():
    env = {"DATABASE_URL": "postgres://app:SECRET@db/app", "GREETING": "hello",
           "API_KEY": "k"}
    assert masked(env) == {"DATABASE_URL": MASK, "GREETING": "hello", "API_KEY": MASK}
