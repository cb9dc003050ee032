"""Peek and list."""

from __future__ import annotations

import uuid

import pytest

from conformance.client import b64, expect, uniq

contract = pytest.mark.contract

PEEK_KEYS = ("found", "queue", "timerKey", "partition", "deliverAt", "txn", "messageId", "payload", "payloadZstd",
             "encrypted", "producerSub", "attempts", "lastError", "claimed", "createdAt", "updatedAt")


@contract("TMR-PEEK-SHAPE")
def test_peek_shape(api):
    q, k = uniq("q"), uniq("k")
    txn = uuid.uuid4().hex
    s = api.schedule(q, k, delay_ms=600_000, txn=txn, payload={"peek": 1}, partition="p1")
    p = api.peek_ok(q, k)
    missing = [key for key in PEEK_KEYS if key not in p]
    assert not missing, f"peek lacks {missing}: {p}"
    assert p["found"] is True and p["queue"] == q and p["timerKey"] == k and p["partition"] == "p1"
    assert p["txn"] == txn and p["messageId"] == s["messageId"] and p["deliverAt"] == s["deliverAt"]
    assert p["payload"] == b64({"peek": 1}), "payload is base64 as stored"
    assert p["payloadZstd"] is False and p["encrypted"] is False and p["claimed"] is False
    assert p["attempts"] == 0 and p["lastError"] is None
    expect(api.cancel(q, k), 200)


@contract("TMR-PEEK-MISS")
def test_peek_miss_is_200(api):
    q, k = uniq("q"), uniq("k")
    resp = api.peek(q, k)
    assert resp.status_code == 200, f"a peek miss is 200, not {resp.status_code}"
    data = resp.json()
    assert data.get("found") is False, data
    assert "payload" not in data or data["payload"] is None


@contract("TMR-LIST-SHAPE")
def test_list_shape(api):
    q = uniq("q")
    keys = sorted(uniq("k") for _ in range(3))
    expect(api.timers([api.schedule_op(q, k, delay_ms=600_000) for k in keys]), 200)
    data = expect(api.list(q), 200)
    assert set(data) >= {"rows", "truncated", "nextAfter"}, data
    assert data["truncated"] is False
    assert [r["timerKey"] for r in data["rows"]] == keys
    for r in data["rows"]:
        assert "payload" not in r, f"list rows carry no payload: {r}"
        assert r["queue"] == q and "deliverAt" in r and "txn" in r and r.get("claimed") is False, r
    _cancel_all(api, q, keys)


@contract("TMR-LIST-AFTER", "TMR-LIST-BYTE-ORDER")
def test_list_cursor_byte_order(api):
    q = uniq("q")
    keys = ["a", "B", "_x", "Z", "b/1", "ä"]
    expect(api.timers([api.schedule_op(q, k, delay_ms=600_000) for k in keys]), 200)
    want = sorted(keys, key=lambda s: s.encode())
    rows = expect(api.list(q), 200)["rows"]
    assert [r["timerKey"] for r in rows] == want, f"not byte order: {[r['timerKey'] for r in rows]}"
    after = expect(api.list(q, after=want[2]), 200)["rows"]
    assert [r["timerKey"] for r in after] == want[3:], "after is exclusive"
    assert expect(api.list(q, after=want[-1]), 200)["rows"] == []
    _cancel_all(api, q, keys)


@contract("TMR-LIST-LIMIT-DEFAULT", "TMR-LIST-TRUNCATED")
def test_list_default_limit_and_truncation(api):
    q = uniq("q")
    keys = [f"k{i:03d}" for i in range(101)]
    expect(api.timers([api.schedule_op(q, k, delay_ms=600_000) for k in keys]), 200)
    page = expect(api.list(q), 200)
    assert len(page["rows"]) == 100 and page["truncated"] is True, (len(page["rows"]), page["truncated"])
    assert page["nextAfter"] == keys[99], page["nextAfter"]
    rest = expect(api.list(q, after=page["nextAfter"]), 200)
    assert [r["timerKey"] for r in rest["rows"]] == [keys[100]] and rest["truncated"] is False, rest
    exact = expect(api.list(q, limit=101), 200)
    assert len(exact["rows"]) == 101 and exact["truncated"] is False, "truncated only when more rows follow"
    two = expect(api.list(q, limit=2), 200)
    assert [r["timerKey"] for r in two["rows"]] == keys[:2] and two["truncated"] is True and two["nextAfter"] == keys[1]
    _cancel_all(api, q, keys)


@contract("TMR-LIST-LIMIT-CLAMPED")
def test_list_limit_clamped(api):
    q = uniq("q")
    keys = [f"k{i}" for i in range(3)]
    expect(api.timers([api.schedule_op(q, k, delay_ms=600_000) for k in keys]), 200)
    for limit, expect_rows in (("0", None), ("-5", None), ("1000000", 3), ("5000", 3)):
        resp = api.list(q, limit=limit)
        assert resp.status_code == 200, f"limit={limit} must be clamped, not rejected: {resp.status_code} {resp.text[:200]}"
        data = resp.json()
        if expect_rows is not None:
            assert len(data["rows"]) == expect_rows and data["truncated"] is False, data
        else:
            assert len(data["rows"]) >= 1, f"limit={limit} clamps up to at least one row: {data}"
            assert data["truncated"] is (len(data["rows"]) < 3), data
    _cancel_all(api, q, keys)


def _cancel_all(api, q: str, keys: list[str]) -> None:
    for i in range(0, len(keys), 256):
        expect(api.timers([{"op": "cancel", "queue": q, "timerKey": k} for k in keys[i:i + 256]]), 200)
