"""One envelope for every refusal: ``{"error", "reason", "detail"}`` with the status of its class, for
each class of bad input; double-slash paths are routed; and no input a client can send makes a 500 or
a traceback (a small seeded fuzz over the POST routes that exist when the suite runs)."""

from __future__ import annotations

import json
import random

import httpx
import pytest
from helpers import refused

FUZZ_ROUTES = (
    "/api/v1/admin/ping",
    "/api/v1/configure",
    "/api/v1/push",
    "/api/v1/timers",
    "/api/v1/kv",
    "/api/v1/transaction",
    "/api/v1/ack",
    "/api/v1/ack/batch",
)


def envelope(r: httpx.Response, status: int, error: str, reason: str) -> dict:
    body = refused(r, status, error, reason)
    assert r.headers["content-type"].startswith("application/json")
    assert isinstance(body["detail"], str) and body["detail"]
    return body


def test_malformed_json(http):
    for raw in (b'{"a": ', b"\xff\xfe\x00", b"{'single': 'quotes'}", b"NaN"):
        r = http.post("/api/v1/admin/ping", content=raw, headers={"Content-Type": "application/json"})
        assert "not valid JSON" in envelope(r, 400, "bad_request", "bad_json")["detail"]
    r = http.post("/api/v1/admin/ping", json=[1, 2])
    envelope(r, 400, "bad_request", "bad_body")
    # The well-formed body goes through, and nothing of the refused ones stuck anywhere.
    assert http.post("/api/v1/admin/ping", json={"a": 1}).json()["echo"] == {"a": 1}


def test_wrong_content_type(http):
    r = http.post("/api/v1/admin/ping", content=b"a=1", headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert "application/x-www-form-urlencoded" in envelope(r, 415, "unsupported_media_type", "content_type")["detail"]
    r = http.post("/api/v1/admin/ping", content=b"{}", headers={"Content-Type": "text/plain"})
    envelope(r, 415, "unsupported_media_type", "content_type")
    # The official client's binary push format is refused off its two routes, naming them.
    r = http.post("/api/v1/admin/ping", content=b"\x01\x02", headers={"Content-Type": "application/x-queen-push"})
    assert "/api/v1/push" in envelope(r, 400, "bad_request", "binary_body_unsupported")["detail"]
    # +json media types and a charset parameter are fine.
    r = http.post("/api/v1/admin/ping", content=b'{"x":true}', headers={"Content-Type": "application/vnd.queen+json; charset=utf-8"})
    assert r.status_code == 200 and r.json()["echo"] == {"x": True}


def test_unknown_route_and_wrong_method(http):
    for path in ("/api/v1/definitely-not-a-route", "/nope", "/api/v1/%ff%00", "/api/v2/whoami"):
        r = http.get(path)
        assert envelope(r, 404, "no_such_route", "no_such_route") == {
            "error": "no_such_route",
            "reason": "no_such_route",
            "detail": "no route matches this path",
        }
    r = http.delete("/api/v1/whoami")
    envelope(r, 405, "method_not_allowed", "method_not_allowed")
    assert "GET" in r.headers["Allow"]
    r = http.put("/api/v1/admin/ping", json={})
    envelope(r, 405, "method_not_allowed", "method_not_allowed")
    assert set(r.headers["Allow"].split(",")) >= {"GET", "POST"}


def test_bad_query_parameter(http):
    r = http.get("/api/v1/test/sleep", params={"ms": "soon"})
    assert "ms='soon'" in envelope(r, 400, "bad_request", "bad_query")["detail"]
    r = http.get("/api/v1/test/sleep", params={"ms": "-1"})
    envelope(r, 400, "bad_request", "bad_query")


def test_a_query_parameter_given_twice_is_refused(http):
    """``?batch=1&batch=500`` names two values for one parameter: refused whole, never one picked."""
    for path in ("/api/v1/pop/queue/q-twice", "/api/v1/ephemeral/pop?queue=q-twice"):
        sep = "&" if "?" in path else "?"
        r = http.get(f"{path}{sep}batch=&batch=5&wait=false")
        assert "batch is given 2 times" in envelope(r, 400, "bad_request", "bad_query")["detail"]
    r = http.get("/api/v1/pop/queue/q-twice?batch=5&wait=false")  # one value: served as before
    assert r.status_code in (200, 204), r.text


def test_double_slash_paths_are_routed(http, broker):
    # The official client joins base_url + path as strings: "http://h:6632/" + "/api/v1/..."
    for path in ("//api/v1/whoami", "/api//v1///whoami", "//health"):
        r = httpx.get(broker.url + path, timeout=10)
        assert r.status_code == 200, (path, r.text)
    r = httpx.post(broker.url + "//api/v1/admin/ping", json={"k": "v"}, timeout=10)
    assert r.status_code == 200 and r.json()["echo"] == {"k": "v"}
    envelope(httpx.get(broker.url + "//api/v1//nothing", timeout=10), 404, "no_such_route", "no_such_route")


def test_oversized_body_is_413(start_broker):
    b = start_broker(env={"QUEEN_MAX_BODY_BYTES": "2048"}, workers=1)
    with httpx.Client(base_url=b.url, timeout=10) as c:
        small = {"pad": "x" * 1500}
        assert c.post("/api/v1/admin/ping", json=small).json()["echo"] == small
        r = c.post("/api/v1/admin/ping", json={"pad": "x" * 5000})
        envelope(r, 413, "payload_too_large", "body_too_large")

        def chunks():  # no Content-Length: the limit still holds while streaming
            for _ in range(10):
                yield b" " * 1000

        r = c.post("/api/v1/admin/ping", content=chunks(), headers={"Content-Type": "application/json"})
        envelope(r, 413, "payload_too_large", "body_too_large")
        assert c.get("/health").status_code == 200


def _random_json(rng: random.Random, depth: int = 0) -> object:
    keys = ("queue", "partition", "items", "payload", "data", "transactionId", "delayMs", "timerKey", "key",
            "value", "ttlMs", "operations", "type", "leaseId", "status", "ops", "namespace", "")
    kind = rng.randrange(9 if depth < 3 else 6)
    if kind == 0:
        return None
    if kind == 1:
        return rng.choice([True, False])
    if kind == 2:
        return rng.choice([0, -1, 1, 2**31, 2**63 - 1, -(2**63), 10**30, 3.5, -0.0, 1e308])
    if kind == 3:
        return rng.choice(["", "x" * rng.randrange(1, 300), "\u0000", "a/b//c", "é€😀", "../..", "NaN"])
    if kind == 4:
        return rng.choice(["00000000-0000-0000-0000-000000000000", "not-a-uuid", "2026-01-01T00:00:00Z"])
    if kind == 5:
        return {}
    if kind == 6:
        return [_random_json(rng, depth + 1) for _ in range(rng.randrange(0, 4))]
    return {rng.choice(keys): _random_json(rng, depth + 1) for _ in range(rng.randrange(1, 6))}


def test_fuzz_never_500_never_traceback(http, broker):
    seed = random.randrange(2**32)
    rng = random.Random(seed)
    log_mark = broker.log_path.stat().st_size
    seen: dict[str, set[int]] = {}
    for path in FUZZ_ROUTES:
        for i in range(40):
            if i % 2:
                body = json.dumps(_random_json(rng), ensure_ascii=rng.random() < 0.5).encode()
                ctype = "application/json"
            else:
                body = rng.randbytes(rng.randrange(0, 400))
                ctype = rng.choice(["application/json", "application/octet-stream", "text/plain", "", "multipart/form-data"])
            headers = {"Content-Type": ctype} if ctype else {}
            r = http.post(path, content=body, headers=headers)
            assert r.status_code < 500, f"seed={seed} {path} {body!r} -> {r.status_code} {r.text}"
            assert b"Traceback" not in r.content
            if r.status_code >= 400:
                env = r.json()
                assert {"error", "reason", "detail"} <= env.keys(), (seed, path, env)
            seen.setdefault(path, set()).add(r.status_code)
    assert seen["/api/v1/admin/ping"] >= {200, 400}, seen
    new_log = broker.log_path.read_bytes()[log_mark:].decode(errors="replace")
    assert "Traceback" not in new_log and "unhandled error" not in new_log, f"seed={seed}\n{new_log[-3000:]}"


@pytest.mark.parametrize("path", ["/api/v1/whoami", "/health", "/metrics/prometheus"])
def test_head_and_options_do_not_500(http, path):
    for method in ("HEAD", "OPTIONS", "PATCH"):
        assert http.request(method, path).status_code < 500
