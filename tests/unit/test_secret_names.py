"""Issue 26 (5): which inherited variable names are secrets (secret_names.py)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from supervisor.core.secret_names import SECRET_WORDS, is_secret_name, name_words, without_secrets
from supervisor.worker.process import task_environment

SECRETS = [
    # the issue's: plain names that passed the old filter
    "KEY", "TOKEN", "APIKEY", "DB_PASS", "GITHUB_PAT", "AZURE_STORAGE_SAS",
    # what the old filter caught must stay caught
    "AZURE_STORAGE_CONNECTION_STRING", "JOBQ_CONNECTION_STRING", "JOBQ_CONTROL_CONNECTION_STRING",
    "CLIENT_SECRET", "MYSQL_PASSWORD", "SMTP_PASSWD", "AZURE_STORAGE_ACCOUNT_KEY",
    "AWS_ACCESS_KEY_ID", "AZURE_SAS_TOKEN", "JOBQ_SIGNING_KEY", "GOOGLE_APPLICATION_CREDENTIALS",
    "MY_API_KEY", "HF_TOKEN",
    # parts, case and separators
    "apiKey", "myAPIKey", "db-password", "db.pwd", "DbPassword", "DBPASSWORD", "KEY1",
    "SSH_PRIVATE_KEY", "SSH_AUTH_SOCK", "NPM_AUTH", "ConnStr", "SQL_CONN_STR", "MYTOKEN",
    "AWS_SECRETKEY", "GPG_PASSPHRASE", "REQUEST_SIGNATURE", "GIT_CREDS", "X_SECRETS_FILE",
    # PostgreSQL: the backend's URL (may hold the password) and libpq's password variables
    "JOBQ_POSTGRES_URL", "PGPASSWORD", "PGPASSFILE",
]
NOT_SECRETS = [
    "PATH", "LD_LIBRARY_PATH", "KEYBOARD", "PASSAGE", "BYPASS_CACHE", "HOME", "USER", "PWD",
    "OLDPWD", "TOKENIZERS_PARALLELISM", "SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "LANG",
    "MONKEY", "PATTERN", "SASS_PATH", "XAUTHORITY", "HARMLESS", "CUDA_VISIBLE_DEVICES",
    "JOBQ_QUEUE_NAME", "PYTHONUNBUFFERED", "TURKEY_COUNT", "PASSENGER",
    "PGHOST", "PGDATABASE", "JOBQ_POSTGRES_SCHEMA",
]


@pytest.mark.parametrize("name", SECRETS)
def test_secret_names(name):
    assert is_secret_name(name)


@pytest.mark.parametrize("name", NOT_SECRETS)
def test_not_secret_names(name):
    assert not is_secret_name(name)


def test_words():
    assert name_words("myAPIKey_2") == ["my", "api", "key", "2"]
    assert name_words("AZURE_STORAGE_SAS") == ["azure", "storage", "sas"]
    assert name_words("db-pass.word") == ["db", "pass", "word"]


_separators = st.sampled_from(["_", "-", "."])
_plain = st.sampled_from(["DB", "AZURE", "MY", "APP", "X1", "GITHUB", "STORAGE"])


@given(st.lists(_plain, max_size=3), st.sampled_from(sorted(SECRET_WORDS)),
       st.lists(_plain, max_size=3), _separators, st.booleans())
def test_a_secret_word_anywhere(before, word, after, sep, upper):
    name = sep.join([*before, word.upper() if upper else word, *after])
    assert is_secret_name(name) or name.upper() == "PWD"  # the shell's cwd, kept by name


@given(st.lists(_plain, min_size=1, max_size=4), _separators)
def test_plain_words_pass(words, sep):
    assert not is_secret_name(sep.join(words))


@given(st.text(max_size=30))
def test_any_name_is_answered(name):
    assert is_secret_name(name) in (True, False)


def test_pass_env_lets_named_ones_through():
    base = {"HF_TOKEN": "t", "DB_PASS": "p", "PATH": "/bin", "KEY": "k"}
    assert without_secrets(base) == {"PATH": "/bin"}
    assert without_secrets(base, ("HF_TOKEN", "hf_token")) == {"PATH": "/bin", "HF_TOKEN": "t"}
    assert task_environment(base, {"JOBQ_X": "1"}, ("KEY",)) == {
        "PATH": "/bin", "KEY": "k", "JOBQ_X": "1"}
