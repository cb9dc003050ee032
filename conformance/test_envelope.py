"""The envelope and status-code rules. Core: a refusal carries an error body the client reads ({error},
reason/code optional); no 500. Strict (this broker's choices): every refusal is {error, reason, detail},
exact statuses for the wrong content type and the oversized body, and error no_such_route."""

from __future__ import annotations

import pytest

from conformance.client import assert_envelope, assert_error_body, body, uniq
from conformance.plugin import cluster_wide

contract = pytest.mark.contract

JSON_ROUTES = ("/api/v1/timers", "/api/v1/kv", "/api/v1/push", "/api/v1/transaction")
CORE_JSON_ROUTES = ("/api/v1/push", "/api/v1/transaction", "/api/v1/ack", "/api/v1/configure")


def _auth(api) -> dict[str, str]:
    return {"Authorization": f"Bearer {api.token}"} if api.token else {}


@contract("ENV-MALFORMED-JSON", "ENV-ERROR-BODY")
def test_malformed_json(api):
    for path in CORE_JSON_ROUTES:
        resp = api.http.post(path, content=b'{"operations": [', headers={"Content-Type": "application/json"})
        assert resp.status_code == 400, f"{path}: malformed JSON is 400, got {resp.status_code}"
        assert_error_body(resp)


@contract("ENV-SHAPE")
def test_malformed_json_envelope(api):
    for path in JSON_ROUTES:
        resp = api.http.post(path, content=b'{"operations": [', headers={"Content-Type": "application/json"})
        assert resp.status_code == 400, f"{path}: malformed JSON is 400, got {resp.status_code}"
        assert_envelope(resp)


@contract("ENV-CONTENT-TYPE", "ENV-SHAPE")
def test_wrong_content_type(api):
    for path in JSON_ROUTES:
        resp = api.http.post(path, content=b'{"operations": []}', headers={"Content-Type": "text/plain"})
        assert 400 <= resp.status_code < 500, f"{path}: a text/plain body is a 4xx, got {resp.status_code}"
        assert_envelope(resp)


@contract("ENV-OVERSIZED", "ENV-SHAPE")
def test_oversized_body(api):
    blob = b'{"operations": [], "pad": "' + b"x" * (9 * 1024 * 1024) + b'"}'
    for path in ("/api/v1/timers", "/api/v1/push"):
        resp = api.http.post(path, content=blob, headers={"Content-Type": "application/json"})
        assert resp.status_code == 413, f"{path}: an oversized body is 413, got {resp.status_code}"
        assert_envelope(resp)


@contract("ENV-NO-SUCH-ROUTE", "ENV-SHAPE")
def test_unknown_route(api):
    for method, path in (("GET", "/api/v1/nope"), ("POST", "/api/v1/queues/x/clear"), ("GET", f"/api/v2/{uniq('x')}"),
                         ("DELETE", "/api/v1/queues/q/clear")):
        resp = api.http.request(method, path)
        assert resp.status_code == 404, f"{method} {path}: expected 404, got {resp.status_code}"
        assert_envelope(resp)
        assert body(resp)["error"] == "no_such_route", body(resp)


@contract("ENV-UNAUTHENTICATED", "ENV-ERROR-BODY")
def test_no_credential(api, target):
    if not api.token:
        from conformance.plugin import not_verified

        not_verified("the target runs without authentication (no --queen-token given)")
    raw = target.raw()
    for method, path in (("POST", "/api/v1/push"), ("GET", "/api/v1/pop/queue/q"), ("POST", "/api/v1/ack"),
                         ("POST", "/api/v1/transaction")):
        resp = raw.request(method, path, json={"items": []} if method == "POST" else None)
        assert resp.status_code == 401, f"{method} {path} without a credential: expected 401, got {resp.status_code}"
        assert_error_body(resp)
    resp = raw.get("/api/v1/pop/queue/q", headers={"Authorization": "Bearer not.a.token"})
    assert resp.status_code == 401
    assert_error_body(resp)


@contract("ENV-SHAPE")
def test_no_credential_envelope(api, target):
    if not api.token:
        from conformance.plugin import not_verified

        not_verified("the target runs without authentication (no --queen-token given)")
    raw = target.raw()
    for method, path in (("POST", "/api/v1/timers"), ("GET", "/api/v1/timers/q/k"), ("DELETE", "/api/v1/timers/q/k"),
                         ("POST", "/api/v1/kv"), ("POST", "/api/v1/push")):
        resp = raw.request(method, path, json={"operations": []} if method == "POST" else None)
        assert resp.status_code == 401, f"{method} {path} without a credential: expected 401, got {resp.status_code}"
        assert_envelope(resp)


def garbage(ns: str) -> list[tuple[str, str, object]]:
    """Requests a client can send that no broker may answer with a 500. ``ns`` keeps each run's KV keys
    apart, so stateful cases (a counter pushed past the float range in two calls) behave the same on
    every run."""
    return [
        ("POST", "/api/v1/timers", {"operations": None}),
        ("POST", "/api/v1/timers", {"operations": [None, 1, "x", []]}),
        ("POST", "/api/v1/timers", {"operations": [{"op": "schedule", "queue": {"a": 1}, "timerKey": [1], "delayMs": 1e30,
                                                    "txn": 5, "payload": 7}]}),
        ("POST", "/api/v1/timers", {"operations": [{"op": "schedule", "queue": "q", "timerKey": "k", "delayMs": 2 ** 70,
                                                    "txn": "t", "payload": ""}]}),
        ("POST", "/api/v1/timers", {"operations": [{"op": "schedule", "queue": "q\u0000", "timerKey": "k\u0000",
                                                    "delayMs": 1, "txn": "t", "payload": "AA=="}]}),
        ("POST", "/api/v1/timers", {"operations": [{"op": "cancel", "queue": "q" * 5000, "timerKey": "k" * 70000}]}),
        ("POST", "/api/v1/timers", {"operations": [{"op": "schedule", "queue": "q", "timerKey": "k", "delayMs": -2 ** 63,
                                                    "txn": "t", "payload": "AA==", "partition": ""}]}),
        ("GET", "/api/v1/timers/q?limit=abc&after=%00", None),
        ("GET", "/api/v1/timers/q/k%00", None),
        ("DELETE", "/api/v1/timers/q/k?txn=%00%ff", None),
        ("POST", "/api/v1/kv", {"operations": [{"op": "get"}]}),
        ("POST", "/api/v1/kv", {"operations": [{"op": "incr", "ns": "a", "key": "k", "delta": "1e400", "forever": True}]}),
        ("POST", "/api/v1/kv", {"operations": [{"op": "incr", "ns": ns, "key": "f", "delta": 1e308, "forever": True},
                                               {"op": "incr", "ns": ns, "key": "i", "delta": 2 ** 80, "forever": True}]}),
        ("POST", "/api/v1/kv", {"operations": [{"op": "incr", "ns": ns, "key": "f", "delta": 1e308, "forever": True}]}),
        ("POST", "/api/v1/kv", {"operations": [{"op": "incr", "ns": ns, "key": "f", "delta": -1e308, "min": -1e308,
                                               "forever": True}]}),
        ("POST", "/api/v1/kv", {"operations": [{"op": "put", "ns": "a", "key": "k\u0000", "value": "\u0000", "forever": True}]}),
        ("POST", "/api/v1/kv", {"operations": [{"op": "put", "ns": "a", "key": "k", "value": 1, "ttlSeconds": 2 ** 62}]}),
        ("POST", "/api/v1/kv", {"operations": [{"op": "getMany", "ns": "a", "keys": "k"}]}),
        ("POST", "/api/v1/kv", {"operations": [{"op": "check", "ns": "a", "key": "k", "expect": 2 ** 70}]}),
        ("POST", "/api/v1/push", {"items": [{"queue": None, "payload": 1}]}),
        ("POST", "/api/v1/push", {"items": [{"queue": "q\u0000", "partition": "p\u0000", "payload": "\u0000",
                                             "transactionId": "t\u0000"}]}),
        ("POST", "/api/v1/push", {"items": "nope"}),
        ("POST", "/api/v1/push", {"items": [{"queue": "q", "payload": 1, "deadlineMs": 2 ** 70}]}),
        ("GET", "/api/v1/pop/queue/q?batch=-1&timeout=abc&wait=maybe", None),
        ("GET", "/api/v1/messages/lookup?queue=&txn=", None),
        ("GET", "/api/v1/dlq?limit=-3&offset=x", None),
        ("POST", "/api/v1/dlq/not-an-id/replay", None),
        ("POST", "/api/v1/transaction", {"operations": [{"type": "bogus"}], "timers": "x", "kv": 3}),
        ("POST", "/api/v1/transaction", {"operations": [], "requiredLeases": ["not-a-lease", 5]}),
        ("POST", "/api/v1/transaction", {"operations": [{"type": "ack", "transactionId": 5, "partitionId": "x",
                                                         "leaseId": "y"}]}),
        ("POST", "/api/v1/ack", {"transactionId": 5, "partitionId": "not-a-partition", "status": "completed",
                                 "leaseId": "zz"}),
        ("POST", "/api/v1/ack/batch", {"acknowledgments": [{"transactionId": "t", "partitionId": "p" * 300,
                                                            "status": "explode"}]}),
        ("POST", "/api/v1/lease/not-a-lease/extend", None),
        ("POST", "/api/v1/configure", {"queue": "q", "options": {"leaseTime": -1, "retryLimit": 1e99}}),
        ("POST", "/api/v1/configure", {"queue": ["q"], "options": "x"}),
        ("DELETE", "/api/v1/resources/queues/%00", None),
        ("GET", "/api/v1/messages/not-a-partition/txn", None),
        ("GET", "/api/v1/pop/queue/q?timeout=99999999999999999999&batch=99999999999999999999", None),
        ("GET", f"/api/v1/timers/q?after=%00&limit={2 ** 70}", None),
        ("POST", "/api/v1/kv", {"operations": [{"op": "getPrefix", "ns": ns, "prefix": "p", "limit": 2 ** 70,
                                               "after": "\u0000"}]}),
        ("POST", "/api/v1/timers", {"operations": [{"op": "schedule", "queue": "q", "timerKey": "z", "delayMs": 1,
                                                    "txn": "t", "payload": "AA==", "payloadZstd": "yes"}]}),
        ("POST", "/api/v1/push", {"items": [{"queue": "q", "payload": [[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]],
                                             "partition": "p" * 70000}]}),
        ("POST", "/api/v1/timers", {"operations": [{"op": "schedule", "queue": "q", "timerKey": ns, "delayMs": 600000,
                                                    "txn": "t\u0000x", "payload": "AA==", "partition": "p\u0000"}]}),
        ("POST", "/api/v1/timers", {"operations": [{"op": "schedule", "queue": ns, "timerKey": "k", "delayMs": 1,
                                                    "txn": "t", "payload": "eyJhIjoxfQ==", "payloadZstd": True}]}),
        ("POST", "/api/v1/transaction", {"operations": [], "kv": [{"op": "put", "ns": ns, "key": "k\u0000",
                                                                   "value": 1, "forever": True}],
                                         "timers": [{"op": "cancel", "queue": "q\u0000", "timerKey": "k"}]}),
        ("POST", "/api/v1/transaction", {"operations": [{"type": "push", "items": [
            {"queue": ns, "payload": 1, "transactionId": "t\u0000", "partition": "\u0000"}]}]}),
        ("GET", "/api/v1/messages/lookup?queue=q%00&txn=%00", None),
        ("GET", "/api/v1/dlq?queue=%00&consumerGroup=%00", None),
        ("GET", "/api/v1/pop/queue/q?consumerGroup=g%00&subscriptionFrom=not-a-date&subscriptionMode=sideways", None),
        ("POST", "/api/v1/configure", {"queue": ns, "options": {"encryptionEnabled": "yes", "leaseTime": 2 ** 70}}),
        ("POST", "/api/v1/kv", {"operations": [{"op": "getMany", "ns": ns, "keys": ["a\u0000", 5, None]}]}),
        ("POST", "/api/v1/kv", {"operations": [{"op": "incr", "ns": ns, "key": "n", "delta": 1, "min": 5, "max": 1,
                                               "ttlSeconds": 5}]}),
        ("GET", f"/api/v1/kv/{ns}/k%00", None),
        ("PUT", f"/api/v1/kv/{ns}/k?ttlSeconds=abc", {"v": 1}),
        ("PUT", f"/api/v1/kv/{ns}/k%00?forever=true", {"v": 1}),
        ("DELETE", "/api/v1/kv/%00/k", None),
        ("GET", "/api/v1/resources/queues/%00", None),
        ("GET", "/api/v1/resources/queues?limit=-1&offset=abc", None),
        ("GET", "/api/v1/usage?tenant=%00", None),
    ]


def _send_garbage(api, target) -> list:
    raw = target.raw()
    return [(method, path, payload, raw.request(method, path, json=payload, headers=_auth(api)))
            for method, path, payload in garbage(f"cf-{uniq('g')[-12:]}")]


@contract("ENV-NO-500")
def test_no_500_on_garbage(api, target):
    bad = [f"{m} {p} {str(b)[:80]} -> {r.status_code} {r.text[:120]}"
           for m, p, b, r in _send_garbage(api, target) if r.status_code >= 500 and r.status_code != 503]
    assert not bad, "garbage answered with a 5xx:\n" + "\n".join(bad)


CORE_PREFIXES = ("/api/v1/push", "/api/v1/pop", "/api/v1/ack", "/api/v1/transaction", "/api/v1/configure",
                 "/api/v1/lease", "/api/v1/dlq")


@contract("ENV-ERROR-BODY")
def test_garbage_refused_with_an_error_body(api, target):
    bad = []
    for m, p, b, r in _send_garbage(api, target):
        # (404/405: a route the broker does not have is ENV-NO-SUCH-ROUTE's business, a strict contract)
        if 400 <= r.status_code < 500 and r.status_code not in (404, 405) and r.content and p.startswith(CORE_PREFIXES):
            try:
                assert_error_body(r)
            except AssertionError as exc:
                bad.append(f"{m} {p} {str(b)[:80]}: {exc}")
    assert not bad, "refusals the client cannot read:\n" + "\n".join(bad)


@contract("ENV-SHAPE")
def test_garbage_refused_in_the_envelope(api, target):
    bad = []
    for m, p, b, r in _send_garbage(api, target):
        if 400 <= r.status_code < 500:
            try:
                assert_envelope(r)
            except AssertionError as exc:
                bad.append(f"{m} {p} {str(b)[:80]}: {exc}")
    assert not bad, "refusals outside the envelope:\n" + "\n".join(bad)


@cluster_wide
@contract("ENV-NO-500-OPERATOR")
def test_no_500_on_operator_garbage(admin, target, tenant_a):
    """The operator surface follows the same rule: no 500 for anything an operator can send."""
    raw = target.raw()
    headers = {"Authorization": f"Bearer {admin.api.token}"} if admin.api.token else {}
    cases = [
        ("PUT", f"/api/v1/admin/tenants/{tenant_a}/plan", {"timersHorizonMs": 2 ** 70}),
        ("PUT", f"/api/v1/admin/tenants/{tenant_a}/plan", {"rateLimitPerS": -1, "bogus": 1}),
        ("PUT", f"/api/v1/admin/tenants/{tenant_a}/plan", ["not", "an", "object"]),
        ("PUT", "/api/v1/admin/tenants/%00/plan", {"maxPayloadBytes": 10}),
        ("POST", f"/api/v1/admin/tenants/{tenant_a}/timers-paused", {"paused": "maybe"}),
        ("POST", "/api/v1/admin/cluster/suspended", {"suspended": None}),
        ("POST", "/api/v1/admin/timers/sweeper", {"paused": 1}),
        ("POST", "/api/v1/admin/timers/scheduling", {}),
        ("GET", "/api/v1/admin/usage?tenant=%00", None),
    ]
    bad = []
    for method, path, payload in cases:
        r = raw.request(method, path, json=payload, headers=headers)
        if r.status_code >= 500 and r.status_code != 503:
            bad.append(f"{method} {path} {payload} -> {r.status_code} {r.text[:120]}")
        elif r.status_code >= 400:
            try:
                assert_envelope(r)
            except AssertionError as exc:
                bad.append(str(exc))
    admin.clear_plan(tenant_a)
    assert not bad, "operator garbage answered outside the rules:\n" + "\n".join(bad)
