"""Encryption at rest per queue, key rotation and a missing key, on dedicated brokers that share one
database (restarting with another key ring is what an operator does)."""

from __future__ import annotations

import base64
import os

import httpx
from conftest import uniq
from helpers import Api, db_fetch

K1 = base64.b64encode(os.urandom(32)).decode()
K2 = base64.b64encode(os.urandom(32)).decode()
ROWS = ("SELECT m.txn, m.key_id, m.codec, m.payload FROM queen_messages m JOIN queen_partitions p "
        "ON p.tenant = m.tenant AND p.id = m.partition_id WHERE p.queue = $1 ORDER BY m.seq")
OPTS = {"leaseTime": 300, "retryLimit": 3, "priority": 0, "delayedProcessing": 0, "windowBuffer": 0, "maxSize": 0,
        "retentionSeconds": 0, "completedRetentionSeconds": 0}


def rows(dsn, q):
    return {r["txn"]: r for r in db_fetch(dsn, ROWS, q)}


def test_encryption_round_trip_rotation_and_missing_key(start_broker):
    q = uniq("enc")
    big = {"text": "confidential " * 400}
    b1 = start_broker(env={"QUEEN_ENCRYPTION_KEYS": f"k1:{K1}"}, workers=1)
    with httpx.Client(base_url=b1.url, timeout=30) as c:
        api = Api(c)
        assert c.post("/api/v1/configure", json={"queue": q, "options": dict(OPTS, encryptionEnabled=True)}).status_code == 200
        api.push_each(q, [{"payload": {"card": "4111-SECRET"}, "transactionId": "a"}])
        api.push_each(q, [{"payload": big, "transactionId": "big"}])
        stored = rows(b1.dsn, q)
        assert stored["a"]["key_id"] == "k1" and b"SECRET" not in stored["a"]["payload"]
        assert stored["big"]["codec"] == 1 and stored["big"]["key_id"] == "k1" and len(stored["big"]["payload"]) < 1000
        got = api.messages(q, batch=50)
        assert [m["data"] for m in got] == [{"card": "4111-SECRET"}, big]
        assert all(x["success"] for x in api.ack_all(got))
        api.push_each(q, [{"payload": "written under k1", "transactionId": "old"}])
    b1.stop()

    # rotation: k2 first (encrypts), k1 kept (decrypts)
    b2 = start_broker(env={"QUEEN_ENCRYPTION_KEYS": f"k2:{K2},k1:{K1}"}, workers=1, dsn=b1.dsn)
    with httpx.Client(base_url=b2.url, timeout=30) as c:
        api = Api(c)
        api.push_each(q, [{"payload": "written under k2", "transactionId": "new"}])
        assert rows(b2.dsn, q)["new"]["key_id"] == "k2"
        got = api.messages(q, batch=50)
        assert [m["data"] for m in got] == ["written under k1", "written under k2"]
        assert all(x["success"] for x in api.ack_all(got))
        assert api.messages(q, batch=50) == []
    b2.stop()


def test_missing_key_is_delivered_undecryptable(start_broker):
    q = uniq("gone")
    b1 = start_broker(env={"QUEEN_ENCRYPTION_KEYS": f"k1:{K1}"}, workers=1)
    with httpx.Client(base_url=b1.url, timeout=30) as c:
        api = Api(c)
        c.post("/api/v1/configure", json={"queue": q, "options": dict(OPTS, encryptionEnabled=True)})
        api.push_each(q, [{"payload": {"v": 1}, "transactionId": "lost"}])
    b1.stop()
    b2 = start_broker(env={"QUEEN_ENCRYPTION_KEYS": f"k2:{K2}"}, workers=1, dsn=b1.dsn)
    with httpx.Client(base_url=b2.url, timeout=30) as c:
        api = Api(c)
        api.push_each(q, [{"payload": {"v": 2}, "transactionId": "kept"}])
        got = api.messages(q, batch=50)
        assert len(got) == 2
        lost, kept = got
        assert lost["data"] is None and lost["undecryptable"] is True
        assert lost["decryptError"] == "key_missing" and lost["keyId"] == "k1"
        assert kept["data"] == {"v": 2}
        assert all(x["success"] for x in api.ack_all(got))
        assert api.messages(q, batch=50) == []
        dlq = c.get("/api/v1/dlq", params={"queue": q}).json()
        assert dlq["total"] == 0


def test_encryption_switched_on_is_honoured_by_every_worker(start_broker):
    q = uniq("switch")
    b = start_broker(env={"QUEEN_ENCRYPTION_KEYS": f"k1:{K1}"}, workers=2)
    with httpx.Client(base_url=b.url, timeout=30) as c:
        api = Api(c)
        for i in range(6):  # both workers now believe the queue is plain
            api.push_each(q, [{"payload": i, "transactionId": f"plain-{i}"}])
        assert c.post("/api/v1/configure", json={"queue": q, "options": dict(OPTS, encryptionEnabled=True)}).status_code == 200
        for i in range(6):
            api.push_each(q, [{"payload": i, "transactionId": f"enc-{i}"}])
    stored = rows(b.dsn, q)
    assert all(stored[f"plain-{i}"]["key_id"] is None for i in range(6))
    assert all(stored[f"enc-{i}"]["key_id"] == "k1" for i in range(6))
