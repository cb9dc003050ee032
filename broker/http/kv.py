"""KV routes.

``POST /api/v1/kv`` ``{"operations": [...]}`` → 200 ``{"results": [...]}``, index-aligned, every op of
docs/protocol.md §4 in one database round trip. A lost ``required`` precondition answers 200
``{"ok": false, "reason": "kv_precondition", "failedIndex", "kvReason", "version", "value"}`` WITHOUT
``results``: nothing of the call was applied, and a results array would describe writes that did not
happen (the official client then reports ``kv_result_missing`` for a single op, ``[]`` for a batch).
No query string is accepted on this route (400 ``kv_no_query_string``): a prefix must never travel in
a URL.

An operator can switch the whole KV surface off (``POST /api/v1/admin/kv {"enabled": false}``): every
KV route then answers 503 ``kv_disabled`` with Retry-After, the transaction rider 403 ``kv_disabled``.

Path routes (curl sugar, ETag = version):

- ``GET /api/v1/kv/{ns}/{key}``: 200 ``{found: true, key, value, version, expiresAt, updatedAt}`` with
  ``ETag: "<version>"`` (``If-None-Match`` with that tag → 304); a miss is 404 ``kv_key_not_found``.
- ``PUT /api/v1/kv/{ns}/{key}?ttlSeconds=N`` or ``?forever=true`` (exactly one), body = the JSON value
  (any content type is read as JSON); ``If-Match: "<version>"`` = expect that version,
  ``If-None-Match: *`` = expect absent. 200 write element with the new ETag; a lost precondition is
  412 ``kv_precondition`` carrying ``kvReason``, ``value`` and ``version``.
- ``DELETE /api/v1/kv/{ns}/{key}`` (``If-Match`` allowed): 200 write element (a missing key answers
  ``applied: false, reason: "absent"``); a lost If-Match is 412.

The key segment is a catch-all: ``a/b/c`` is one key. Grants: writes need ``produce``; reads need
``consume`` or ``produce``. Writes pass the limits rungs (``kv_write``, one op each): the admission
is ``broker.kv.service.admit``, shared with the transaction rider.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from broker.context import broker, principal
from broker.errors import ApiError, NotFound
from broker.http.wire import json_response, parse_json, read_json
from broker.kv import service, store
from broker.kv.parse import CODE, KvCall, bad, check_key, check_ns, parse_body, parse_ops
from broker.kv.service import apply_db

__all__ = ["apply_db", "setup"]  # apply_db: re-exported for tests/test_kv.py



async def kv_batch(request: web.Request) -> web.Response:
    b = broker(request)
    if request.query_string:
        raise bad("kv_no_query_string", "POST /api/v1/kv takes no query string; everything goes in the body")
    body = await read_json(request, code=CODE)
    call = parse_body(body, max_ops=b.settings.kv_max_ops)
    return await _run(request, call, batch=True)


async def _run(request: web.Request, call: KvCall, *, batch: bool) -> web.Response:
    done = await service.run(broker(request), principal(request), call)
    if done.abort is not None:
        return json_response(store.precondition_body(done.abort))
    return json_response({"results": done.results})


def _path(request: web.Request) -> tuple[str, str]:
    ns = check_ns(request.match_info["ns"], "path")
    key = check_key(request.match_info["key"], "path")
    return ns, key


def _etag(version: int) -> str:
    return f'"{version}"'


def _parse_tag(raw: str) -> int:
    tag = raw.strip()
    if tag.startswith("W/"):
        tag = tag[2:]
    tag = tag.strip('"')
    try:
        v = int(tag)
    except ValueError:
        raise bad("kv_bad_expect", f"If-Match must carry a version ETag, got {raw!r}") from None
    if v <= 0:
        raise bad("kv_bad_expect", "If-Match must name a version > 0 (use If-None-Match: * for 'must not exist')")
    return v


def _expect_from_headers(request: web.Request) -> int | None:
    if_match = request.headers.get("If-Match")
    if_none = request.headers.get("If-None-Match")
    if if_match is not None and if_none is not None:
        raise bad("kv_bad_expect", "give If-Match or If-None-Match, not both")
    if if_none is not None:
        if if_none.strip() != "*":
            raise bad("kv_bad_expect", "on a write, If-None-Match only takes * (the key must not exist)")
        return 0
    return None if if_match is None else _parse_tag(if_match)


def _no_query(request: web.Request, allowed: frozenset[str] = frozenset()) -> None:
    for k in request.query:
        if k not in allowed:
            raise bad("kv_no_query_string", f"query parameter {k!r} is not accepted here")


def _precondition_lost(r: dict[str, Any]) -> ApiError:
    return ApiError(
        r["reason"],
        f"the precondition did not hold ({r['reason']}); the current version is {r['version']}",
        code="kv_precondition",
        status=412,
        headers={"ETag": _etag(r["version"])} if r["version"] else None,
        extra={"kvReason": r["reason"], "key": r["key"], "value": r["value"], "version": r["version"]},
    )


async def kv_get(request: web.Request) -> web.StreamResponse:
    ns, key = _path(request)
    _no_query(request)
    call = parse_ops([{"op": "get", "ns": ns, "key": key}], max_ops=1)
    done = await service.run(broker(request), principal(request), call)
    r = done.results[0]
    if not r["found"]:
        raise NotFound("kv_key_not_found", f"no live key {key!r} in namespace {ns!r}", code="kv_key_not_found")
    etag = _etag(r["version"])
    inm = request.headers.get("If-None-Match")
    if inm is not None and etag in [t.strip().removeprefix("W/") for t in inm.split(",")]:
        return web.Response(status=304, headers={"ETag": etag})
    body = {k: r[k] for k in ("found", "key", "value", "version", "expiresAt", "updatedAt")}
    return json_response(body, headers={"ETag": etag})


async def kv_put(request: web.Request) -> web.Response:
    ns, key = _path(request)
    _no_query(request, frozenset({"ttlSeconds", "forever"}))
    op: dict[str, Any] = {"op": "put", "ns": ns, "key": key}
    raw_ttl = request.query.get("ttlSeconds")
    if raw_ttl is not None:
        try:
            op["ttlSeconds"] = int(raw_ttl)
        except ValueError:
            raise bad("kv_bad_ttl", f"ttlSeconds={raw_ttl!r} is not an integer") from None
    raw_forever = request.query.get("forever")
    if raw_forever is not None:
        if raw_forever.lower() not in ("true", "1"):
            raise bad("kv_bad_ttl", "forever takes only true")
        op["forever"] = True
    raw = await request.read()
    if not raw:
        raise bad("kv_bad_body", "PUT needs the JSON value as its body")
    op["value"] = parse_json(raw, code=CODE, reason="kv_bad_body")
    expect = _expect_from_headers(request)
    if expect is not None:
        op["expect"] = expect
    return await _write(request, op)


async def kv_delete(request: web.Request) -> web.Response:
    ns, key = _path(request)
    _no_query(request)
    op: dict[str, Any] = {"op": "delete", "ns": ns, "key": key}
    if request.headers.get("If-None-Match") is not None:
        raise bad("kv_bad_expect", "DELETE takes If-Match, not If-None-Match")
    expect = _expect_from_headers(request)
    if expect is not None:
        op["expect"] = expect
    return await _write(request, op)


async def _write(request: web.Request, op: dict[str, Any]) -> web.Response:
    if "expect" in op:
        op["required"] = True  # a conditional write that loses its condition is refused whole (412)
    call = parse_ops([op], max_ops=1)
    done = await service.run(broker(request), principal(request), call)
    if done.abort is not None:  # a lost If-Match/If-None-Match: the op is required, so nothing is metered
        a = done.abort
        raise _precondition_lost({"reason": a["kvReason"], "version": a["version"], "value": a["value"], "key": op["key"]})
    r = done.results[0]
    headers = {"ETag": _etag(r["version"])} if r["version"] else None
    return json_response(r, headers=headers)


def setup(app: web.Application) -> None:
    app.router.add_post("/api/v1/kv", kv_batch)
    app.router.add_get(r"/api/v1/kv/{ns}/{key:[\s\S]+}", kv_get)
    app.router.add_put(r"/api/v1/kv/{ns}/{key:[\s\S]+}", kv_put)
    app.router.add_delete(r"/api/v1/kv/{ns}/{key:[\s\S]+}", kv_delete)
