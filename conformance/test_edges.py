"""Edges, not neighbourhoods: every numeric rule checked at its exact boundary. The allowed value passes,
the next one is refused (and the refusal changes nothing).

Where the edge is the target's setting and the target states it (GET /api/v1/usage -> plan: the horizon
and the max payload) it is read from there (the ``plan`` fixture); the others are the documented values,
or a --queen-* option where the operator may change them.
"""

from __future__ import annotations

import base64
import email.utils
import json
import uuid
from typing import Any

import pytest

from conformance.client import OK, expect, expect_error, parse_ts, uniq
from conformance.test_limits import rung, until_status

contract = pytest.mark.contract

MIB = 1024 * 1024


def _json_string_of(n_bytes: int) -> str:
    """A string whose JSON text is exactly ``n_bytes`` bytes (the quotes included)."""
    return "x" * (n_bytes - 2)


def _item(q: str, payload: Any, txn: str | None = None, **extra: Any) -> dict[str, Any]:
    return {"queue": q, "partition": "Default", "payload": payload, "transactionId": txn or uuid.uuid4().hex, **extra}


# ------------------------------------------------------------------------------------------ timers


@contract("EDGE-TMR-HORIZON-MS")
def test_horizon_exact_ms(api, plan):
    horizon = plan["timersHorizonMs"]
    q, at, past = uniq("q"), uniq("at"), uniq("past")
    r = api.schedule(q, at, delay_ms=horizon)
    assert r["ok"] is True and r["status"] == "scheduled", f"delayMs == horizon ({horizon}) must be accepted: {r}"
    resp = api.timers([api.schedule_op(q, past, delay_ms=horizon + 1)])
    expect_error(resp, 403, "timer_horizon_exceeded")
    assert api.peek_ok(q, past)["found"] is False
    expect(api.cancel(q, at), 200)


@contract("EDGE-TMR-PAYLOAD-BYTES")
def test_timer_payload_ceiling_exact_bytes(api, plan):
    ceiling = min(MIB, plan["maxPayloadBytes"])
    q, fits, over = uniq("q"), uniq("fits"), uniq("over")
    op = api.schedule_op(q, fits, delay_ms=600_000)
    op["payload"] = base64.b64encode(json.dumps(_json_string_of(ceiling)).encode()).decode()
    res = expect(api.timers([op]), 200)["results"][0]
    assert res["ok"] is True, f"a payload of exactly {ceiling} bytes must be scheduled: {res}"
    op = api.schedule_op(q, over, delay_ms=600_000)
    op["payload"] = base64.b64encode(json.dumps(_json_string_of(ceiling + 1)).encode()).decode()
    expect_error(api.timers([op]), 413, "payload_too_large")
    assert api.peek_ok(q, over)["found"] is False
    expect(api.cancel(q, fits), 200)


@contract("EDGE-TMR-NAME-LENGTH")
def test_timer_name_lengths(api):
    q256 = uniq("q").ljust(256, "q")
    k1024 = uniq("k").ljust(1024, "k")
    res = expect(api.timers([api.schedule_op(q256, k1024, delay_ms=600_000)]), 200)["results"][0]
    assert res["ok"] is True, res
    expect_error(api.timers([api.schedule_op(q256 + "q", uniq("k"), delay_ms=600_000)]), 400)
    expect_error(api.timers([api.schedule_op(q256, k1024 + "k", delay_ms=600_000)]), 400)
    assert [r["timerKey"] for r in expect(api.list(q256), 200)["rows"]] == [k1024]
    expect(api.cancel(q256, k1024), 200)


@contract("EDGE-TMR-LIST-CLAMP")
def test_timer_list_limit_clamp(api):
    q = uniq("q")
    keys = [f"k{i:04d}" for i in range(1001)]
    for i in range(0, len(keys), 256):
        res = expect(api.timers([api.schedule_op(q, k, delay_ms=3_600_000) for k in keys[i:i + 256]]), 200)["results"]
        assert all(r["ok"] for r in res)
    try:
        for limit, want in (("1000", 1000), ("1001", 1000), ("0", 1)):
            data = expect(api.list(q, limit=limit), 200)
            assert len(data["rows"]) == want and data["truncated"] is True, \
                f"limit={limit}: {len(data['rows'])} rows, truncated={data['truncated']} (want {want})"
    finally:
        for i in range(0, len(keys), 256):
            api.timers([{"op": "cancel", "queue": q, "timerKey": k} for k in keys[i:i + 256]])


# ------------------------------------------------------------------------------------------ the log


@contract("EDGE-LOG-PAYLOAD-BYTES")
def test_push_payload_exact_bytes(api, plan):
    limit = plan["maxPayloadBytes"]
    q, fits, over = uniq("q"), uuid.uuid4().hex, uuid.uuid4().hex
    res = expect(api.push_items([_item(q, _json_string_of(limit), fits)]), 201)
    assert res[0]["status"] == "queued", f"a payload of exactly {limit} JSON bytes must be queued: {res}"
    expect_error(api.push_items([_item(q, _json_string_of(limit + 1), over)]), 413, reason="payload_too_large")
    assert api.lookup(q, over)["found"] is False


@contract("EDGE-LOG-NAME-LENGTH")
def test_log_name_lengths(api):
    q256, p256 = uniq("q").ljust(256, "q"), "p" * 256
    t = uuid.uuid4().hex
    res = expect(api.push_items([{**_item(q256, 1, t), "partition": p256}]), 201)
    assert res[0]["status"] == "queued", res
    bad_q, bad_p = uuid.uuid4().hex, uuid.uuid4().hex
    expect_error(api.push_items([_item(q256 + "q", 1, bad_q)]), 400)
    expect_error(api.push_items([{**_item(q256, 1, bad_p), "partition": p256 + "p"}]), 400)
    assert api.lookup(q256, t)["found"] is True and api.lookup(q256, bad_p)["found"] is False


@contract("EDGE-LOG-TXN-LENGTH")
def test_log_transaction_id_length(api):
    q = uniq("q")
    t512 = uuid.uuid4().hex.ljust(512, "t")
    res = expect(api.push_items([_item(q, 1, t512)]), 201)
    assert res[0]["status"] == "queued" and res[0]["transaction_id"] == t512
    expect_error(api.push_items([_item(q, 2, t512 + "t")]), 400)
    assert len(api.drain(q)) == 1


@contract("EDGE-PUSH-ITEMS")
def test_push_items_per_call(api):
    q = uniq("q")
    items = [_item(q, i) for i in range(10_001)]
    expect_error(api.push_items(items), 400)
    assert api.lookup(q, items[0]["transactionId"])["found"] is False, "a refused push wrote items"
    res = expect(api.push_items(items[:10_000]), 201)
    assert len(res) == 10_000 and all(r["status"] == "queued" for r in res[:1] + res[-1:])


@contract("EDGE-DEADLINE-MS")
def test_deadline_bounds(api):
    q = uniq("q")
    week = 7 * 86_400_000
    for ok in (1, week):
        t = uuid.uuid4().hex
        assert expect(api.push_items([_item(q, ok, t, deadlineMs=ok)]), OK)[0]["status"] == "queued", ok
    for bad in (0, week + 1):
        t = uuid.uuid4().hex
        expect_error(api.push_items([_item(q, bad, t, deadlineMs=bad)]), 400)
        assert api.lookup(q, t)["found"] is False


@contract("EDGE-DLQ-LIMIT-CLAMP")
def test_dlq_limit_clamp(api):
    q = uniq("q")
    for sent, want in (("1000", 1000), ("1001", 1000), ("0", 1), ("1", 1)):
        data = expect(api.http.get("/api/v1/dlq", params={"queue": q, "limit": sent}), 200)
        assert data.get("limit") == want, f"limit={sent}: the answer says limit={data.get('limit')} (want {want})"


# ------------------------------------------------------------------------------------------ KV


def _put(ns: str, key: str, value: Any, **extra: Any) -> dict[str, Any]:
    return {"op": "put", "ns": ns, "key": key, "value": value, "ttlSeconds": 600, **extra}


def _ns() -> str:
    return f"cf-edge-{uuid.uuid4().hex[:10]}"


@contract("EDGE-KV-OPS")
def test_kv_ops_per_call(api):
    n = _ns()
    expect_error(api.kv([_put(n, f"k{i}", i) for i in range(257)]), 400)
    assert api.kv_ok([{"op": "get", "ns": n, "key": "k0"}])[0]["found"] is False
    res = api.kv_ok([_put(n, f"k{i}", i) for i in range(256)])
    assert all(r.get("applied") for r in res), res[:3]


@contract("EDGE-KV-TXN-OPS")
def test_kv_rider_ops(api):
    n = _ns()
    over = {"operations": [], "kv": [_put(n, f"o{i}", i) for i in range(65)]}
    expect_error(api.http.post("/api/v1/transaction", json=over), 400)
    assert api.kv_ok([{"op": "get", "ns": n, "key": "o0"}])[0]["found"] is False
    fits = {"operations": [], "kv": [_put(n, f"k{i}", i) for i in range(64)]}
    data = expect(api.http.post("/api/v1/transaction", json=fits), 200)
    assert data.get("success") is True and len(data["results"]) == 64, data


@contract("EDGE-KV-VALUE-BYTES")
def test_kv_value_exact_bytes(api):
    n = _ns()
    assert api.kv_ok([_put(n, "fits", _json_string_of(65_536))])[0]["applied"] is True
    expect_error(api.kv([_put(n, "over", _json_string_of(65_537))]), 413)
    assert api.kv_ok([{"op": "get", "ns": n, "key": "over"}])[0]["found"] is False


@contract("EDGE-KV-KEY-BYTES")
def test_kv_key_exact_bytes(api):
    n = _ns()
    k512 = "\u00e9" * 255 + "ab"  # 255 two-byte characters + 2 = 512 UTF-8 bytes
    assert len(k512.encode()) == 512
    assert api.kv_ok([_put(n, k512, 1)])[0]["applied"] is True
    resp = api.kv([_put(n, k512 + "c", 1)])
    assert 400 <= resp.status_code < 500, f"a 513-byte key: {resp.status_code} {resp.text[:200]}"
    got = api.kv_ok([{"op": "getPrefix", "ns": n, "prefix": "\u00e9"}])[0]
    assert [r["key"] for r in got["rows"]] == [k512], got


@contract("EDGE-KV-NAMESPACE")
def test_kv_namespace_length(api):
    n64 = ("cf" + uuid.uuid4().hex).ljust(64, "n")
    assert api.kv_ok([_put(n64, "k", 1)])[0]["applied"] is True
    expect_error(api.kv([_put(n64 + "n", "k", 1)]), 400)


@contract("EDGE-KV-PREFIX-CLAMP")
def test_kv_prefix_limit_clamp(api):
    n = _ns()
    keys = [f"p/{i:04d}" for i in range(1001)]
    for i in range(0, len(keys), 256):
        api.kv_ok([_put(n, k, 0, ttlSeconds=120) for k in keys[i:i + 256]])
    for limit, want in ((1000, 1000), (1001, 1000), (0, 1)):
        page = api.kv_ok([{"op": "getPrefix", "ns": n, "prefix": "p/", "limit": limit}])[0]
        assert len(page["rows"]) == want and page["truncated"] is True, \
            f"limit={limit}: {len(page['rows'])} rows, truncated={page['truncated']} (want {want})"


@contract("EDGE-KV-TTL")
def test_kv_ttl_bounds(api):
    n = _ns()
    top = 100 * 365 * 86_400
    for ttl in (1, top):
        assert api.kv_ok([_put(n, f"t{ttl}", 1, ttlSeconds=ttl)])[0]["applied"] is True, ttl
    for ttl in (0, top + 1):
        expect_error(api.kv([_put(n, f"bad{ttl}", 1, ttlSeconds=ttl)]), 400)
        assert api.kv_ok([{"op": "get", "ns": n, "key": f"bad{ttl}"}])[0]["found"] is False


# ------------------------------------------------------------------------------------------ Retry-After


def _server_now(resp) -> float:
    date = resp.headers.get("date")
    assert date, "an answer without a Date header"
    return email.utils.parsedate_to_datetime(date).timestamp()


@contract("EDGE-RETRY-AFTER")
def test_retry_after_values(api, admin, tenant_a):
    q = uniq("q")
    push = lambda: api.push_items([_item(q, 1)])  # noqa: E731
    with rung(admin, api, "rate", tenant_a):
        resp = until_status(push, (429,), "push over a 1 message/s rate")
        assert resp.headers.get("retry-after") == "1", f"rate_limited at 1/s: Retry-After {resp.headers.get('retry-after')!r}"
    expect(push(), 201)
    with rung(admin, api, "quota", tenant_a):
        resp = until_status(push, (429,), "push over the period quota")
        ra = resp.headers.get("retry-after", "")
        assert ra.isdigit() and int(ra) >= 1, f"quota_exceeded: Retry-After {ra!r}"
        end = parse_ts(api.usage()["periodEnd"])
        left = end - _server_now(resp)
        assert abs(int(ra) - left) <= 2.5, f"Retry-After {ra} s but the period resets in {left:.0f} s"
