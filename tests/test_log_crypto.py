"""Encryption at rest per queue, key rotation and a missing key, on dedicated brokers that share one
database (restarting with another key ring is what an operator does)."""

from __future__ import annotations

import base64
import os

import asyncpg
import httpx
from conftest import run_sync, uniq

K1 = base64.b64encode(os.urandom(32)).decode()
K2 = base64.b64encode(os.urandom(32)).decode()
OPTS = {"leaseTime": 300, "retryLimit": 3, "priority": 0, "delayedProcessing": 0, "windowBuffer": 0, "maxSize": 0,
        "retentionSeconds": 0, "completedRetentionSeconds": 0}


def rows(dsn, q):
    async def go():
        conn = await asyncpg.connect(dsn)
        try:
            return await conn.fetch(
                "SELECT m.txn, m.key_id, m.codec, m.payload FROM queen_messages m JOIN queen_partitions p "
                "ON p.tenant = m.tenant AND p.id = m.partition_id WHERE p.queue = $1 ORDER BY m.seq", q)
        finally:
            await conn.close()

    return {r["txn"]: r for r in run_sync(go())}


def push(c, q, txn, payload):
    r = c.post("/api/v1/push", json={"items": [{"queue": q, "payload": payload, "transactionId": txn}]})
    assert r.status_code == 201, r.text


def pop_all(c, q):
    r = c.get(f"/api/v1/pop/queue/{q}", params={"batch": 50, "wait": "false"})
    return r.json()["messages"] if r.status_code == 200 else []


def ack_all(c, msgs):
    res = c.post("/api/v1/ack/batch", json={"acknowledgments": [
        {"transactionId": m["transactionId"], "partitionId": m["partitionId"], "leaseId": m["leaseId"], "status": "completed"}
        for m in msgs]}).json()
    assert all(x["success"] for x in res)


def test_encryption_round_trip_rotation_and_missing_key(start_broker):
    q = uniq("enc")
    big = {"text": "confidential " * 400}
    b1 = start_broker(env={"QUEEN_ENCRYPTION_KEYS": f"k1:{K1}"}, workers=1)
    with httpx.Client(base_url=b1.url, timeout=30) as c:
        assert c.post("/api/v1/configure", json={"queue": q, "options": dict(OPTS, encryptionEnabled=True)}).status_code == 200
        push(c, q, "a", {"card": "4111-SECRET"})
        push(c, q, "big", big)
        stored = rows(b1.dsn, q)
        assert stored["a"]["key_id"] == "k1" and b"SECRET" not in stored["a"]["payload"]
        assert stored["big"]["codec"] == 1 and stored["big"]["key_id"] == "k1" and len(stored["big"]["payload"]) < 1000
        got = pop_all(c, q)
        assert [m["data"] for m in got] == [{"card": "4111-SECRET"}, big]
        ack_all(c, got)
        push(c, q, "old", "written under k1")
    b1.stop()

    # rotation: k2 first (encrypts), k1 kept (decrypts)
    b2 = start_broker(env={"QUEEN_ENCRYPTION_KEYS": f"k2:{K2},k1:{K1}"}, workers=1, dsn=b1.dsn)
    with httpx.Client(base_url=b2.url, timeout=30) as c:
        push(c, q, "new", "written under k2")
        assert rows(b2.dsn, q)["new"]["key_id"] == "k2"
        got = pop_all(c, q)
        assert [m["data"] for m in got] == ["written under k1", "written under k2"]
        ack_all(c, got)
        assert pop_all(c, q) == []
    b2.stop()


def test_missing_key_is_delivered_undecryptable(start_broker):
    q = uniq("gone")
    b1 = start_broker(env={"QUEEN_ENCRYPTION_KEYS": f"k1:{K1}"}, workers=1)
    with httpx.Client(base_url=b1.url, timeout=30) as c:
        c.post("/api/v1/configure", json={"queue": q, "options": dict(OPTS, encryptionEnabled=True)})
        push(c, q, "lost", {"v": 1})
    b1.stop()
    b2 = start_broker(env={"QUEEN_ENCRYPTION_KEYS": f"k2:{K2}"}, workers=1, dsn=b1.dsn)
    with httpx.Client(base_url=b2.url, timeout=30) as c:
        push(c, q, "kept", {"v": 2})
        got = pop_all(c, q)
        assert len(got) == 2
        lost, kept = got
        assert lost["data"] is None and lost["undecryptable"] is True
        assert lost["decryptError"] == "key_missing" and lost["keyId"] == "k1"
        assert kept["data"] == {"v": 2}
        ack_all(c, got)
        assert pop_all(c, q) == []
        dlq = c.get("/api/v1/dlq", params={"queue": q}).json()
        assert dlq["total"] == 0


def test_encryption_switched_on_is_honoured_by_every_worker(start_broker):
    q = uniq("switch")
    b = start_broker(env={"QUEEN_ENCRYPTION_KEYS": f"k1:{K1}"}, workers=2)
    with httpx.Client(base_url=b.url, timeout=30) as c:
        for i in range(6):  # both workers now believe the queue is plain
            push(c, q, f"plain-{i}", i)
        assert c.post("/api/v1/configure", json={"queue": q, "options": dict(OPTS, encryptionEnabled=True)}).status_code == 200
        for i in range(6):
            push(c, q, f"enc-{i}", i)
    stored = rows(b.dsn, q)
    assert all(stored[f"plain-{i}"]["key_id"] is None for i in range(6))
    assert all(stored[f"enc-{i}"]["key_id"] == "k1" for i in range(6))
