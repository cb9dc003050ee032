"""Encryption happens at schedule (docs/timer-routes.md §7): a timer bound for a queue that encrypts at rest
is stored encrypted from the moment it is scheduled; peek shows the ciphertext and never decrypts;
switching encryption on later delivers earlier timers in clear; a key removed between schedule and fire
makes that frame undecryptable (and the pop says so instead of failing)."""

from __future__ import annotations

import base64
import os
from functools import partial

import asyncpg
import httpx
import pytest
import zstandard
from conftest import run_sync, uniq
from helpers import Api, db_fetch, dedicated_broker, timer_op

K1 = base64.b64encode(os.urandom(32)).decode()
K2 = base64.b64encode(os.urandom(32)).decode()
sched = partial(timer_op, delay=0)


def stored(dsn: str, txn: str) -> dict:
    rows = db_fetch(dsn, "SELECT key_id, payload FROM queen_messages WHERE txn = $1", txn)
    return dict(rows[0]) if rows else {}


@pytest.fixture(scope="module")
def enc(pg, tmp_path_factory):
    env = {"QUEEN_ENCRYPTION_KEYS": f"k1:{K1}", "QUEEN_SWEEPER_MAX_SLEEP_MS": "200"}
    with dedicated_broker(pg, tmp_path_factory, "timers-enc", env) as b:
        yield b


def test_encrypted_at_schedule_peek_shows_ciphertext_fire_delivers_plaintext(enc):
    q, txn = uniq("enc"), uniq("txn")
    plain = b'{"card": "4242"}'
    with Api(httpx.Client(base_url=enc.url)) as c:
        c.configure(q, encryptionEnabled=True)
        [res] = c.post("/api/v1/timers", json={"operations": [sched(q, "k", delay=60_000, txn=txn, payload=plain)]}).json()["results"]
        assert res["status"] == "scheduled"
        peek = c.get(f"/api/v1/timers/{q}/k").json()
        assert peek["encrypted"] is True
        raw = base64.b64decode(peek["payload"])
        assert plain not in raw and b"4242" not in raw  # ciphertext at rest, never decrypted by peek
        c.post("/api/v1/timers", json={"operations": [sched(q, "k", delay=0, txn=txn, payload=plain)]})
        [msg] = c.delivered(q)
        assert msg["data"] == {"card": "4242"} and msg["transactionId"] == txn
        assert stored(enc.dsn, txn)["key_id"] == "k1"


def test_zstd_payload_to_an_encrypting_queue(enc):
    q = uniq("enc")
    body = b'{"z": "' + b"y" * 3000 + b'"}'
    with Api(httpx.Client(base_url=enc.url)) as c:
        c.configure(q, encryptionEnabled=True)
        op = sched(q, "k", payloadZstd=True, payload=zstandard.ZstdCompressor().compress(body))
        assert c.post("/api/v1/timers", json={"operations": [op]}).status_code == 200
        [msg] = c.delivered(q)
        assert msg["data"] == {"z": "y" * 3000}


def test_encrypting_queue_needs_json_now(enc):
    q = uniq("enc")
    with Api(httpx.Client(base_url=enc.url)) as c:
        c.configure(q, encryptionEnabled=True)
        r = c.post("/api/v1/timers", json={"operations": [sched(q, "k", payload=b"\x00\x01 not json")]})
        assert r.status_code == 400 and r.json()["reason"] == "timers_payload_not_json"


def test_encryption_switched_on_later_delivers_earlier_timers_in_clear(enc):
    q, txn = uniq("enc"), uniq("txn")
    with Api(httpx.Client(base_url=enc.url)) as c:
        c.configure(q, encryptionEnabled=False)
        c.post("/api/v1/timers", json={"operations": [sched(q, "k", delay=1500, txn=txn, payload=b'{"early": 1}')]})
        c.configure(q, encryptionEnabled=True)
        assert c.get(f"/api/v1/timers/{q}/k").json()["encrypted"] is False
        [msg] = c.delivered(q)
        assert msg["data"] == {"early": 1}
        assert stored(enc.dsn, txn)["key_id"] is None  # delivered in clear, as declared


def test_a_key_removed_between_schedule_and_fire_gives_an_undecryptable_frame(start_broker):
    a = start_broker(env={"QUEEN_ENCRYPTION_KEYS": f"k1:{K1}"}, workers=1)
    q, txn = uniq("enc"), uniq("txn")
    with Api(httpx.Client(base_url=a.url)) as c:
        c.configure(q, encryptionEnabled=True)
        r = c.post("/api/v1/timers", json={"operations": [sched(q, "k", delay=1500, txn=txn, payload=b'{"secret": 1}')]})
        assert r.status_code == 200
    a.stop()
    b = start_broker(env={"QUEEN_ENCRYPTION_KEYS": f"k2:{K2}"}, workers=1, dsn=a.dsn)  # k1 is gone
    with Api(httpx.Client(base_url=b.url)) as c:
        [msg] = c.delivered(q)
        assert msg["transactionId"] == txn
        assert msg["data"] is None and msg.get("undecryptable") is True
    assert stored(a.dsn, txn)["key_id"] == "k1"


def test_an_encrypting_queue_without_keys_is_refused_not_stored_in_clear(start_broker):
    b = start_broker(workers=1)
    q = uniq("enc")

    async def flag() -> None:
        conn = await asyncpg.connect(b.dsn)
        try:
            await conn.execute("INSERT INTO queen_queues (tenant, name, encryption_enabled) VALUES ('default', $1, true)", q)
        finally:
            await conn.close()

    run_sync(flag())
    with Api(httpx.Client(base_url=b.url)) as c:
        r = c.post("/api/v1/timers", json={"operations": [sched(q, "k", payload=b"{}")]})
        assert r.status_code == 503 and r.json()["error"] == "timers_misconfigured"
        assert c.get(f"/api/v1/timers/{q}/k").json()["found"] is False
