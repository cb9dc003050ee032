"""Client input that once answered 500 and bodies without a JSON content type:
each is refused 400/415 in the envelope, and nothing of a refused call is applied."""

from __future__ import annotations

import uuid

import httpx
import pytest
from conftest import uniq

from broker.http.wire import MAX_JSON_DEPTH, too_deep


def envelope(r: httpx.Response, status: int, reason: str | None = None) -> dict:
    assert r.status_code == status, (r.status_code, r.text)
    body = r.json()
    assert {"error", "reason", "detail"} <= body.keys(), body
    if reason is not None:
        assert body["reason"] == reason, body
    return body


def nested(depth: int) -> object:
    value: object = 1
    for i in range(depth):
        value = [value] if i % 2 else {"k": value}
    return value


def test_too_deep_counts_levels():
    assert not too_deep(nested(MAX_JSON_DEPTH))
    assert too_deep(nested(MAX_JSON_DEPTH + 1))
    assert not too_deep({"a": [1, 2, {"b": "x" * 10}]}, 3) and too_deep({"a": [1, 2, {"b": [1]}]}, 3)


@pytest.mark.parametrize("group", [["a"], {"a": 1}, [], 7, True])
def test_consumer_group_must_be_a_name(http, group):
    pid, txn = str(uuid.uuid4()), "t1"
    ack = {"transactionId": txn, "partitionId": pid, "status": "completed", "consumerGroup": group}
    if group:  # an empty list is falsy: the default group applies, the ack is answered normally
        envelope(http.post("/api/v1/ack", json=ack), 400, "bad_name")
        envelope(http.post("/api/v1/ack/batch", json={"acknowledgments": [ack, ack]}), 400, "bad_name")
        envelope(http.post("/api/v1/ack/batch", json={"consumerGroup": group, "acknowledgments": [ack]}), 400, "bad_name")
    r = http.post("/api/v1/transaction", json={"operations": [{"type": "ack", **ack}]})
    assert r.status_code < 500, r.text


def nested_text(depth: int) -> str:
    """The text of ``nested(depth)`` (orjson cannot write more than 254 levels)."""
    text = "1"
    for i in range(depth):
        text = f"[{text}]" if i % 2 else '{"k":' + text + "}"
    return text


@pytest.mark.parametrize("depth", [MAX_JSON_DEPTH + 1, 255, 300, 1_000, 1_024])
def test_json_nested_too_deep_is_refused_at_read(http, depth):
    q = uniq("deep")
    payload = nested_text(depth - 3)  # every body below wraps the payload in 3 or more levels
    bodies = {
        "/api/v1/push": '{"items": [{"queue": "%s", "payload": %s}]}',
        "/api/v1/transaction": '{"operations": [{"type": "push", "items": [{"queue": "%s", "payload": %s}]}]}',
        "/api/v1/kv": '{"operations": [{"op": "put", "ns": "deep", "key": "%s", "value": %s, "forever": true}]}',
        "/api/v1/admin/ping": '{"echo": {"q": "%s", "v": [%s]}}',
    }
    for path, template in bodies.items():
        r = http.post(path, content=(template % (q, payload)).encode(), headers={"Content-Type": "application/json"})
        envelope(r, 400, "json_too_deep")
    r = http.put(f"/api/v1/kv/deep/{q}?forever=true", content=nested_text(depth).encode())
    assert envelope(r, 400, "json_too_deep")["error"] == "kv_bad_request"
    # Nothing of it was applied.
    assert http.get(f"/api/v1/kv/deep/{q}").status_code == 404
    assert http.get(f"/api/v1/pop/queue/{q}").status_code == 204


def test_a_deep_but_allowed_payload_round_trips(http):
    q = uniq("deepok")
    payload = nested(MAX_JSON_DEPTH - 3)  # {"items":[{"payload": ...}]} adds three levels
    r = http.post("/api/v1/push", json={"items": [{"queue": q, "payload": payload}]})
    assert r.status_code == 201, r.text
    r = http.get(f"/api/v1/pop/queue/{q}")
    assert r.status_code == 200 and r.json()["messages"][0]["data"] == payload


@pytest.mark.parametrize("value", ["9999-12-31T23:59:59-14:00", "0001-01-01T00:00:00+14:00", "10000-01-01", "garbage"])
def test_timestamps_the_database_cannot_hold(http, value):
    envelope(http.get("/api/v1/dlq", params={"from": value}), 400, "bad_timestamp")
    envelope(http.get("/api/v1/dlq", params={"to": value}), 400, "bad_timestamp")
    envelope(http.get(f"/api/v1/pop/queue/{uniq('ts')}", params={"subscriptionFrom": value}), 400, "bad_timestamp")
    # The extremes that do fit are fine.
    assert http.get("/api/v1/dlq", params={"from": "9999-12-31T23:59:59Z"}).status_code == 200
    assert http.get("/api/v1/dlq", params={"from": "0001-01-01T00:00:00Z"}).status_code == 200


def test_a_body_without_content_type_is_refused(http):
    q = uniq("noctype")
    body = b'{"items": [{"queue": "%s", "payload": {"a": 1}}]}' % q.encode()
    r = httpx.post(http.base_url.join("/api/v1/push"), content=body)  # httpx sends no Content-Type here
    assert "content-type" not in {k.lower() for k in r.request.headers}
    envelope(r, 415, "content_type")
    for ctype in ("application/octet-stream", "text/plain", "application/x-www-form-urlencoded"):
        envelope(http.post("/api/v1/push", content=body, headers={"Content-Type": ctype}), 415, "content_type")
    assert http.get(f"/api/v1/pop/queue/{q}").status_code == 204  # nothing was queued
    # Explicit JSON types are accepted; an empty body with no type still means {} where allowed.
    assert http.post("/api/v1/push", content=body, headers={"Content-Type": "application/json; charset=utf-8"}).status_code == 201
    assert http.post("/api/v1/admin/ping").json()["echo"] == {}


async def test_the_official_client_sends_a_content_type(broker):
    from queen import Queen

    q = uniq("client")
    async with Queen(broker.url) as client:
        await client.queue(q).create()
        await client.queue(q).push([{"data": {"n": 1}}])
        got = await client.queue(q).batch(1).wait(False).pop()
        assert [m["data"] for m in got] == [{"n": 1}]
