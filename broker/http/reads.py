"""``POST /api/v1/fetch`` (docs/protocol.md §2.14), ``consume`` grant: ``{"entries": [{"queue",
"partition", "offset", "maxBytes"}], "maxBytes"}`` → ``{"entries": [...]}`` one per entry, in order, each
``{"records": [{"offset", "transactionId", "payload", "ts"}], "highWatermark", "logStartOffset",
"error"?}`` (``OFFSET_OUT_OF_RANGE``, ``UNKNOWN_TOPIC_OR_PARTITION``). At most 1024 entries per call."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from broker.context import broker, principal
from broker.errors import BadRequest
from broker.http.wire import json_response, read_object
from broker.log import parse, reads

MAX_ENTRIES = 1024
DEFAULT_MAX_BYTES = 8 * 1024 * 1024
ENTRY_KEYS = frozenset({"queue", "partition", "offset", "maxBytes"})


def _int(value: Any, what: str, lo: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < lo:
        raise BadRequest("bad_fetch", f"{what} must be an integer >= {lo}")
    return value


async def fetch(request: web.Request) -> web.Response:
    p = principal(request)
    p.require("consume")
    body = await read_object(request)
    raw = body.get("entries")
    if not isinstance(raw, list) or not raw:
        raise BadRequest("bad_fetch", "entries must be a non-empty array")
    if len(raw) > MAX_ENTRIES:
        raise BadRequest("too_many_entries", f"at most {MAX_ENTRIES} entries per fetch")
    max_bytes = _int(body.get("maxBytes", DEFAULT_MAX_BYTES), "maxBytes", 1)
    entries = []
    for i, e in enumerate(raw):
        if not isinstance(e, dict):
            raise BadRequest("bad_fetch", f"entries[{i}] must be an object")
        for key in e:
            if key not in ENTRY_KEYS:
                raise BadRequest("unknown_field", f"entries[{i}].{key} is not a fetch field", extra={"field": key})
        entries.append(reads.FetchEntry(
            parse.name(e.get("queue"), f"entries[{i}].queue"), parse.name(e.get("partition"), f"entries[{i}].partition"),
            _int(e.get("offset", 0), f"entries[{i}].offset", 0), _int(e.get("maxBytes", max_bytes), f"entries[{i}].maxBytes", 1)))
    return json_response(await reads.fetch(broker(request), p.tenant, entries, max_bytes))


CHANGED_KEYS = frozenset({"queue", "limit", "since", "after"})


async def changed(request: web.Request) -> web.Response:
    """``POST /api/v1/partitions/changed`` ``{"entries": [{"queue", "limit", "since"?, "after"?}]}`` →
    ``{"safeTime", "entries": [{"partitions": [{"name", "id", "lastOffset", "logStart", "lastWriteAt"}],
    "next"?}]}``: partitions written at or after ``since``, in creation order, paged by ``after``."""
    p = principal(request)
    p.require("consume")
    body = await read_object(request)
    raw = body.get("entries")
    if not isinstance(raw, list) or not raw or len(raw) > 64:
        raise BadRequest("bad_changed", "entries must be an array of 1..64 entries")
    entries = []
    for i, e in enumerate(raw):
        if not isinstance(e, dict):
            raise BadRequest("bad_changed", f"entries[{i}] must be an object")
        for key in e:
            if key not in CHANGED_KEYS:
                raise BadRequest("unknown_field", f"entries[{i}].{key} is not a field here", extra={"field": key})
        since = e.get("since")
        if since is not None and not isinstance(since, str):
            raise BadRequest("bad_timestamp", f"entries[{i}].since must be an ISO-8601 string")
        after = e.get("after")
        entries.append(reads.ChangedEntry(
            parse.name(e.get("queue"), f"entries[{i}].queue"),
            parse.timestamp(since, f"entries[{i}].since") if since else None,
            parse.parse_uuid(after, f"entries[{i}].after") if after is not None else None,
            min(_int(e.get("limit", 1000), f"entries[{i}].limit", 1), 1000)))
    return json_response(await reads.changed(broker(request), p.tenant, entries))


def setup(app: web.Application) -> None:
    app.router.add_post("/api/v1/fetch", fetch)
    app.router.add_post("/api/v1/partitions/changed", changed)
