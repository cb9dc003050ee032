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


async def read_json(request: web.Request, *, allow_empty: bool = False, code: str = "bad_request") -> Any:
    """Read and parse the JSON body.

    ``allow_empty``: an absent body (no bytes) is returned as ``{}``; the official client sends no body
    and no content type for an empty dict. Anything else must be ``application/json``; aiohttp refuses
    bodies over ``QUEEN_MAX_BODY_BYTES`` with 413 before we see them.
    """
    raw = await request.read()
    if not raw:
        if allow_empty:
            return {}
        raise BadRequest("body_required", "this route needs a JSON body", code=code)
    ctype = request.content_type
    if ctype not in (JSON, "application/octet-stream") and not ctype.endswith("+json"):
        if ctype == "application/x-queen-push":
            raise BadRequest(
                "binary_body_unsupported",
                "this broker does not accept the binary push body; turn binary_push off in the client",
                code=code,
            )
        raise UnsupportedMediaType("content_type", f"expected Content-Type application/json, got {ctype!r}")
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise BadRequest("bad_json", f"the body is not valid JSON: {exc}", code=code) from None


async def read_object(request: web.Request, *, allow_empty: bool = False, code: str = "bad_request") -> dict[str, Any]:
    body = await read_json(request, allow_empty=allow_empty, code=code)
    if not isinstance(body, dict):
        raise BadRequest("bad_body", "the body must be a JSON object", code=code)
    return body


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
