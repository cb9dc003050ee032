"""The HTTP edge's shared parsing and rendering: JSON bodies in, JSON answers out, query parameters.

Every handler reads its body with ``read_json`` and answers with ``json_response``, so the content
type rules, the size limit and the envelope on malformed input are the same on every route.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson
from aiohttp import web

from broker.errors import BadRequest, UnsupportedMediaType

JSON = "application/json"


def json_response(body: Any, *, status: int = 200, headers: Mapping[str, str] | None = None) -> web.Response:
    return web.Response(body=orjson.dumps(body), status=status, content_type=JSON, headers=headers)


# The deepest JSON a body may nest (arrays and objects, the body itself counting as 1). orjson parses
# up to 1,024 levels but serialises only 254, and a payload is serialised again when it is stored and
# when it is delivered inside an answer; 128 leaves room for those envelopes.
MAX_JSON_DEPTH = 128
ACCEPTED_TYPES = (JSON,)


def too_deep(value: Any, limit: int = MAX_JSON_DEPTH) -> bool:
    """True when ``value`` nests arrays/objects more than ``limit`` levels deep (iterative: no recursion)."""
    if not isinstance(value, (dict, list)):
        return False
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > limit:
            return True
        for child in node.values() if isinstance(node, dict) else node:
            if isinstance(child, (dict, list)):
                stack.append((child, depth + 1))
    return False


def parse_json(raw: bytes, *, code: str = "bad_request", reason: str = "bad_json") -> Any:
    """Parse a JSON document, refusing malformed JSON and JSON nested deeper than ``MAX_JSON_DEPTH``
    (400 ``json_too_deep``) before anything acts on it."""
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        if "depth limit" in str(exc):  # orjson's own ceiling (1,024): the same refusal as ours
            raise BadRequest("json_too_deep", f"the body nests arrays/objects more than {MAX_JSON_DEPTH} levels deep", code=code) from None
        raise BadRequest(reason, f"the body is not valid JSON: {exc}", code=code) from None
    # Cheap gate first: a document with fewer brackets than the limit cannot be too deep.
    if raw.count(b"[") + raw.count(b"{") > MAX_JSON_DEPTH and too_deep(value):
        raise BadRequest(
            "json_too_deep", f"the body nests arrays/objects more than {MAX_JSON_DEPTH} levels deep", code=code
        )
    return value


async def read_json(request: web.Request, *, allow_empty: bool = False, code: str = "bad_request") -> Any:
    """Read and parse the JSON body.

    ``allow_empty``: an absent body (no bytes) is returned as ``{}``; the official client sends no body
    and no content type for an empty dict. A body must come with an explicit ``Content-Type:
    application/json`` (or ``*/*+json``): one without a type (which aiohttp reports as
    ``application/octet-stream``) is refused 415 like any other type. aiohttp refuses bodies over
    ``QUEEN_MAX_BODY_BYTES`` with 413 before we see them; JSON deeper than ``MAX_JSON_DEPTH`` is 400.
    """
    raw = await request.read()
    if not raw:
        if allow_empty:
            return {}
        raise BadRequest("body_required", "this route needs a JSON body", code=code)
    ctype = request.content_type if "Content-Type" in request.headers else ""
    if ctype not in ACCEPTED_TYPES and not ctype.endswith("+json"):
        if ctype == "application/x-queen-push":
            raise BadRequest(
                "binary_body_unsupported",
                "only POST /api/v1/push and /api/v1/transaction take the binary body (application/x-queen-push)",
                code=code,
            )
        got = repr(ctype) if ctype else "no Content-Type"
        raise UnsupportedMediaType("content_type", f"expected Content-Type application/json, got {got}")
    return parse_json(raw, code=code)


async def read_object(request: web.Request, *, allow_empty: bool = False, code: str = "bad_request") -> dict[str, Any]:
    body = await read_json(request, allow_empty=allow_empty, code=code)
    if not isinstance(body, dict):
        raise BadRequest("bad_body", "the body must be a JSON object", code=code)
    return body


def refuse_repeated_query(request: web.Request) -> None:
    """Every query parameter of the API takes one value: ``?batch=1&batch=500`` is ambiguous (which one
    did the client mean?), so it is refused whole instead of one value being picked silently."""
    query = request.query
    if len(query) == len(set(query.keys())):
        return
    for name in dict.fromkeys(query.keys()):
        given = len(query.getall(name))
        if given > 1:
            raise BadRequest("bad_query", f"query parameter {name} is given {given} times; give it once")


def q_int(
    request: web.Request, name: str, default: int, *, lo: int | None = None, hi: int | None = None, clamp: bool = False
) -> int:
    raw = request.query.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise BadRequest("bad_query", f"query parameter {name}={raw!r} is not an integer") from None
    if lo is not None and value < lo:
        if not clamp:
            raise BadRequest("bad_query", f"query parameter {name} must be >= {lo}")
        value = lo
    if hi is not None and value > hi:
        if not clamp:
            raise BadRequest("bad_query", f"query parameter {name} must be <= {hi}")
        value = hi
    return value


def q_bool(request: web.Request, name: str, default: bool) -> bool:
    raw = request.query.get(name)
    if raw is None or raw == "":
        return default
    v = raw.lower()
    if v in ("true", "1", "yes"):
        return True
    if v in ("false", "0", "no"):
        return False
    raise BadRequest("bad_query", f"query parameter {name}={raw!r} is not a boolean")
