"""The OpenAPI document (broker/openapi.yaml, served at /openapi.json): valid OpenAPI 3.1, and the same
set of routes as the router, both ways. (tests/conftest.py validates every exchange of the suite against
it; tests/test_openapi_fuzz.py runs schemathesis against a live broker.)"""

from __future__ import annotations

import re
import uuid

import pytest
from openapi_spec_validator import validate

from broker.app import AUTHENTICATED_PREFIXES, create_app
from broker.config import Settings
from broker.http.openapi import document

METHODS = ("get", "put", "post", "delete", "patch")


def _doc_routes() -> set[tuple[str, str]]:
    return {(m.upper(), path) for path, item in document()["paths"].items() for m in METHODS if m in item}


def _router_routes() -> set[tuple[str, str]]:
    app = create_app(Settings(), "postgresql://unused/never-connected")
    out = set()
    for route in app.router.routes():
        if route.method == "HEAD":  # aiohttp adds HEAD to every GET route by itself
            continue
        # aiohttp's {name:regex} is OpenAPI's {name} (the catch-all is marked x-catch-all in the document)
        out.add((route.method, re.sub(r"\{(\w+):[^}]+\}", r"{\1}", route.resource.canonical)))
    return out


def test_the_document_is_valid_openapi_3_1():
    doc = document()
    assert doc["openapi"].startswith("3.1")
    validate(doc)


def test_every_route_is_documented_and_every_documented_route_exists():
    router, doc = _router_routes(), _doc_routes()
    assert router - doc == set(), "routes the broker mounts that broker/openapi.yaml does not describe"
    assert doc - router == set(), "routes broker/openapi.yaml describes that the broker does not mount"


def _operations():  # type: ignore[no-untyped-def]
    for path, item in document()["paths"].items():
        for m in METHODS:
            if m in item:
                yield path, m, item[m]


def test_api_operations_document_auth_and_unavailable_and_open_routes_need_no_credential():
    for path, method, op in _operations():
        if path.startswith(AUTHENTICATED_PREFIXES) and path != "/api/v1/health":
            assert {"401", "503"} <= set(op["responses"]), f"{method} {path}"
            assert "security" not in op, f"{method} {path}: the document-wide bearer scheme applies"
        else:
            assert op.get("security") == [], f"{method} {path} is open (no credential)"
        assert "500" not in op["responses"] and "default" not in op["responses"], f"{method} {path}"


def test_test_hooks_are_marked_as_such():
    for path, method, op in _operations():
        hook = path.startswith("/api/v1/test/")
        assert bool(op.get("x-test-hook")) == hook, f"{method} {path}"
        assert ("test-hooks" in op.get("tags", [])) == hook, f"{method} {path}"


def test_error_responses_carry_the_envelope():
    responses = document()["components"]["responses"]
    for path, method, op in _operations():
        for status, resp in op["responses"].items():
            if int(status) < 400 or path.startswith(("/health", "/api/v1/health")):
                continue
            resp = responses[resp["$ref"].rsplit("/", 1)[-1]] if "$ref" in resp else resp
            schema = resp["content"]["application/json"]["schema"]
            refs = [schema.get("$ref")] + [s.get("$ref") for s in schema.get("allOf", [])]
            assert "#/components/schemas/Error" in refs, f"{method} {path} {status}"
    err = document()["components"]["schemas"]["Error"]
    assert err["required"] == ["error", "reason", "detail"] and err["additionalProperties"] is True


def test_served_at_openapi_json_without_a_credential(http):
    r = http.get("/openapi.json")
    assert r.status_code == 200 and r.headers["content-type"].startswith("application/json")
    assert r.json() == document()


@pytest.mark.parametrize("path", ["/api/v1/whoami", "/health"])
def test_the_traffic_hook_sees_exchanges(http, path, _openapi_traffic_hook):
    before = _openapi_traffic_hook.checked
    assert http.get(path).status_code == 200
    assert _openapi_traffic_hook.checked == before + 1


def test_the_traffic_hook_catches_a_mismatch(broker, _openapi_traffic_hook):
    """Fed a made-up exchange that contradicts the document, the hook records it (then we drop it)."""
    import httpx

    hook, before = _openapi_traffic_hook, len(_openapi_traffic_hook.failures)
    cases = [
        # an undocumented body shape
        (httpx.Request("GET", broker.url + "/api/v1/whoami"), 200, b'{"tenant": "t"}'),
        # an undocumented status
        (httpx.Request("GET", broker.url + "/api/v1/whoami"), 418, b'{"error":"x","reason":"x","detail":"x"}'),
        # the broker "accepting" a request the document refuses (an unknown push field)
        (httpx.Request("POST", broker.url + "/api/v1/push", json={"items": [{"queue": "q", "tenant": "x"}]}), 201, b"[]"),
        # a path the document does not have, answered 200
        (httpx.Request("GET", broker.url + "/api/v1/nowhere"), 200, b"{}"),
    ]
    for request, status, body in cases:
        hook.check(request, status, httpx.Headers({"content-type": "application/json"}), body)
    found = hook.failures[before:]
    del hook.failures[before:]
    assert len(found) == len(cases), found
    assert "GET /api/v1/whoami -> 200: the response does not match the document" in found[0]
    assert "-> 418" in found[1] and "accepted a request the document refuses" in found[2]
    assert "no such path" in found[3]


def test_every_name_the_broker_accepts_reaches_its_path_route(http):
    """Found by schemathesis: a queue named with a brace, or a key with a line break, matched no route
    (aiohttp's default segment pattern excludes braces, ``.+`` excludes line breaks): 404 instead of an
    answer. Path segments now take anything but ``/``, catch-all keys anything at all."""
    from urllib.parse import quote

    queue = f"q{{}}-{uuid.uuid4().hex[:8]}"
    assert http.post("/api/v1/configure", json={"queue": queue}).status_code == 200
    q = quote(queue, safe="")
    assert http.get(f"/api/v1/pop/queue/{q}").status_code == 204
    assert http.get(f"/api/v1/pop/queue/{q}/partition/%7Bp%7D").status_code == 204
    assert http.get(f"/api/v1/resources/queues/{q}").status_code == 200
    assert http.get(f"/api/v1/timers/{q}").status_code == 200
    key = quote("line\nbreak/{k}", safe="/")
    assert http.get(f"/api/v1/timers/{q}/{key}").json()["found"] is False
    assert http.get(f"/api/v1/messages/{uuid.uuid4()}/%7Btxn%7D").json()["reason"] == "message_not_found"
    assert http.get("/api/v1/kv/ns/line%0Abreak").json()["reason"] == "kv_key_not_found"
