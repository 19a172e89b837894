"""Issue 7 on Storage Queue (Azurite): signatures survive the round trip; no secret leaks.

One full flow: push signed tasks (and one unsigned), run them with the connection string in
the environment, and look for the account key and the signing key everywhere an operator or
a task could see text: every log line, every jobq-ctl output (plain and --json), the raw
dead-letter messages in ``<queue>-failed`` and the task's own environment.
"""

from __future__ import annotations

import json
import os

import pytest

from tests.azure.conftest import ACCOUNT_KEY

pytestmark = [pytest.mark.azure, pytest.mark.timeout(90)]


def test_signed_flow_leaks_no_secret(sq):
    key_text = os.urandom(32).hex()
    key = sq.tmp / "signing.key"
    key.write_text(key_text + "\n")
    key.chmod(0o600)
    sign = ("--signing-key-file", str(key))
    envfile = sq.tmp / "task-env.txt"
    [ok] = sq.ctl("push", "-c", f"env > {envfile}", *sign).stdout.split()
    [bad] = sq.ctl("push", "-c", "echo failing-output; exit 3", "--max-attempts", "1",
                   *sign).stdout.split()
    [unsigned] = sq.ctl("push", "-c", f"touch {sq.tmp}/unsigned-ran").stdout.split()

    outputs = []

    def ctl(*args: str) -> str:
        res = sq.ctl(*args)
        outputs.append(f"$ jobq-ctl {' '.join(args)}\n{res.stdout}{res.stderr}")
        return res.stdout

    ctl("size")
    ctl("status")
    ctl("status", "--json")
    ctl("peek")
    peeked = json.loads(ctl("peek", "--json"))
    assert {p["id"] for p in peeked} == {ok, bad, unsigned}

    sup = sq.supervisor("--exit-when-empty", "--poll-interval", "0.2", "--log-level", "DEBUG",
                        *sign)
    assert sup.wait(60) == 4, sup.log()[-3000:]

    # the signature came through Azurite intact: both signed tasks ran, the unsigned one not
    assert envfile.exists() and not (sq.tmp / "unsigned-ran").exists()
    records = {r["id"]: r for r in json.loads(ctl("failed", "--json"))}
    assert set(records) == {bad, unsigned}
    assert records[unsigned]["reason"] == "signature invalid: no signature"
    assert "exit status 3" in records[bad]["reason"]
    assert "failing-output" in records[bad]["output_tail"]
    ctl("failed")
    ctl("status")
    ctl("status", "--json")
    ctl("size")
    raw = [m.content for m in sq.client("-failed").peek_messages(max_messages=32)]
    assert len(raw) == 2 and any('"jobq_sig"' in m for m in raw)

    texts = {"supervisor log": sup.log(), "jobq-ctl output": "\n".join(outputs),
             "dead-letter messages": "\n".join(raw), "task environment": envfile.read_text()}
    assert "JOBQ_TASK_ID=" in texts["task environment"]
    assert "Lock renewed till" in texts["supervisor log"] or "DEBUG" in texts["supervisor log"]
    for where, text in texts.items():
        assert ACCOUNT_KEY not in text, f"account key in the {where}"
        assert ACCOUNT_KEY[:20] not in text, f"part of the account key in the {where}"
        assert key_text not in text and key_text[:16] not in text, f"signing key in the {where}"
