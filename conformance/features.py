"""Does the target offer a feature at all? One probe per feature of ``catalogue.FEATURES``, sent once per run
(only for features the selected tests need), before any contract needing it runs.

A probe says "missing" only on an answer a broker gives for a route it does not have: 404, 405 or 501, or
a 2xx/4xx that is not JSON (some brokers serve a web console's HTML page on every unknown GET), or, for
the features the protocol lets a broker ignore (docs/protocol.md §9: binary bodies, frames, conflation),
the documented sign of ignoring it. Anything else (a 2xx, a 400 in JSON, a 401/403) says the route is
there: its contracts run and are judged. A probe never creates anything that outlives it: every name is
fresh and unique, every write is to a queue nobody else reads.
"""

from __future__ import annotations

import struct
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import quote

import httpx

MISSING_STATUSES = frozenset({404, 405, 501})


@dataclass(frozen=True)
class Probe:
    missing: bool
    evidence: str  # "METHOD path -> status (what it said)", printed once per feature


def _route(http: httpx.Client, method: str, path: str, **kw: object) -> Probe:
    try:
        resp = http.request(method, path, **kw)  # type: ignore[arg-type]
    except httpx.HTTPError as exc:
        return Probe(False, f"{method} {path} -> {type(exc).__name__}: cannot tell, so the contracts run")
    ctype = resp.headers.get("content-type", "")
    said = resp.text[:120].replace("\n", " ")
    where = f"{method} {path} -> {resp.status_code}"
    if resp.status_code in MISSING_STATUSES:
        return Probe(True, f"{where} {said}".strip())
    if resp.status_code not in (204, 401, 403) and "json" not in ctype:
        return Probe(True, f"{where} with a {ctype or 'no'} content type, not the route's JSON answer")
    return Probe(False, where)


def _name() -> str:
    return f"cf-probe-{uuid.uuid4().hex[:12]}"


def _binary(http: httpx.Client) -> Probe:
    # An empty QPB1 body (magic, flags 0, zero items): a broker that has the binary push answers it like
    # an empty JSON push (2xx []); one that does not reads it as malformed JSON (400) or lacks the type (415).
    body = b"QPB1" + struct.pack("<BI", 0, 0)
    try:
        resp = http.post("/api/v1/push", content=body, headers={"Content-Type": "application/x-queen-push"})
    except httpx.HTTPError as exc:
        return Probe(False, f"binary push -> {type(exc).__name__}: cannot tell, so the contracts run")
    if 200 <= resp.status_code < 300:
        return Probe(False, f"POST /api/v1/push (application/x-queen-push) -> {resp.status_code}")
    return Probe(True, f"POST /api/v1/push with an empty QPB1 body -> {resp.status_code} {resp.text[:100]}"
                       " (docs/protocol.md §9: the binary bodies are safe to omit)")


def _conflation(http: httpx.Client) -> Probe:
    # docs/protocol.md §2.4: every answer to a conflating pop echoes "conflation": true, empty ones included;
    # §9: a broker without conflation refuses it or ignores it (no echo).
    q = _name()
    path = f"/api/v1/pop/queue/{quote(q, safe='')}"
    try:
        resp = http.get(path, params={"consumerGroup": "probe", "conflation": "true", "wait": "false",
                                      "timeout": "1", "batch": "1"})
    except httpx.HTTPError as exc:
        return Probe(False, f"conflating pop -> {type(exc).__name__}: cannot tell, so the contracts run")
    data = resp.json() if "json" in resp.headers.get("content-type", "") and resp.content else None
    if isinstance(data, dict) and data.get("conflation") is True:
        return Probe(False, f"GET {path}?conflation=true -> {resp.status_code} with the echo")
    return Probe(True, f"GET /api/v1/pop/queue/<q>?consumerGroup=g&conflation=true -> {resp.status_code} without "
                       "the \"conflation\": true echo (docs/protocol.md §2.4, §9)")


def _frames(http: httpx.Client) -> Probe:
    # A framed pop may answer JSON (LOG-POP-FRAMED); a broker offers frames when the framed answer carries
    # a decimal partitionId that acknowledges like the UUID. Without a message there is nothing to read,
    # so the probe pushes one to a fresh queue and pops it framed.
    q = _name()
    try:
        push = http.post("/api/v1/push", json={"items": [{"queue": q, "partition": "Default", "payload": 1,
                                                           "transactionId": uuid.uuid4().hex}]})
        if not 200 <= push.status_code < 300:
            return Probe(False, f"frames: the probe's push answered {push.status_code}: cannot tell, so the contracts run")
        resp = http.get(f"/api/v1/pop/queue/{quote(q, safe='')}",
                        params={"frames": "true", "wait": "false", "timeout": "1", "batch": "1", "autoAck": "true"})
    except httpx.HTTPError as exc:
        return Probe(False, f"framed pop -> {type(exc).__name__}: cannot tell, so the contracts run")
    if resp.content[:4] == b"QPF1" or "x-queen" in resp.headers.get("content-type", ""):
        return Probe(False, f"GET /api/v1/pop/queue/<q>?frames=true -> {resp.status_code} framed")
    return Probe(True, f"GET /api/v1/pop/queue/<q>?frames=true -> {resp.status_code} "
                       f"{resp.headers.get('content-type', '')}: not the framed form (docs/protocol.md §9: safe to omit)")


def _deadlines(http: httpx.Client) -> Probe:
    # deadlineMs is an item field of push (docs/queued-call-deadlines.md); a broker with deadlines hands the
    # message out with its deadlineAt (DL-POP-DEADLINE). One without refuses the field (400) or ignores it:
    # the popped message then carries no deadlineAt.
    q = _name()
    try:
        resp = http.post("/api/v1/push", json={"items": [{"queue": q, "partition": "Default", "payload": 1,
                                                           "transactionId": uuid.uuid4().hex, "deadlineMs": 60_000}]})
        if resp.status_code == 400 or resp.status_code in MISSING_STATUSES:
            return Probe(True, f"POST /api/v1/push with deadlineMs -> {resp.status_code} {resp.text[:100]}")
        if not 200 <= resp.status_code < 300:
            return Probe(False, f"push with deadlineMs -> {resp.status_code}: cannot tell, so the contracts run")
        pop = http.get(f"/api/v1/pop/queue/{quote(q, safe='')}",
                       params={"wait": "false", "timeout": "1", "batch": "1", "autoAck": "true"})
    except httpx.HTTPError as exc:
        return Probe(False, f"push with deadlineMs -> {type(exc).__name__}: cannot tell, so the contracts run")
    data = pop.json() if pop.status_code == 200 and "json" in pop.headers.get("content-type", "") else None
    msgs = data.get("messages") if isinstance(data, dict) else None
    if isinstance(msgs, list) and msgs and isinstance(msgs[0], dict):
        if msgs[0].get("deadlineAt"):
            return Probe(False, "a message pushed with deadlineMs pops with its deadlineAt")
        return Probe(True, "POST /api/v1/push with deadlineMs -> "
                           f"{resp.status_code}, and the message pops without a deadlineAt: the field is ignored")
    return Probe(False, f"the probe's pop answered {pop.status_code}: cannot tell, so the contracts run")


def _lookup(http: httpx.Client) -> Probe:
    # A hit, not a miss: a broker may answer a miss 404 (a wrong answer LOG-LOOKUP must catch, not a
    # missing route), so the probe looks up a message it has just pushed.
    q, txn = _name(), uuid.uuid4().hex
    try:
        push = http.post("/api/v1/push", json={"items": [{"queue": q, "partition": "Default", "payload": 1,
                                                           "transactionId": txn}]})
    except httpx.HTTPError as exc:
        return Probe(False, f"lookup: the probe's push failed ({type(exc).__name__}): cannot tell, so the contracts run")
    if not 200 <= push.status_code < 300:
        return Probe(False, f"lookup: the probe's push answered {push.status_code}: cannot tell, so the contracts run")
    return _route(http, "GET", "/api/v1/messages/lookup", params={"queue": q, "txn": txn})


PROBES: dict[str, Callable[[httpx.Client], Probe]] = {
    "lookup": _lookup,
    # without a queue: a 400 from a broker that has the route (a fresh queue's name would be a 404 of ours)
    "messages": lambda h: _route(h, "GET", "/api/v1/messages"),
    "dlq-replay": lambda h: _route(h, "POST", "/api/v1/dlq/not-a-dlq-id/replay"),
    "timers": lambda h: _route(h, "GET", f"/api/v1/timers/{_name()}", params={"limit": "1"}),
    "kv": lambda h: _route(h, "POST", "/api/v1/kv", json={"operations": [{"op": "get", "ns": "cf-probe", "key": _name()}]}),
    "locks": lambda h: _route(h, "POST", "/api/v1/locks", json={"operations": [{"op": "get", "name": _name()}]}),
    "ephemeral": lambda h: _route(h, "GET", "/api/v1/ephemeral/queues"),
    "streams": lambda h: _route(h, "POST", "/streams/v1/state/get", json={}),
    "deadlines": _deadlines,
    "admin": lambda h: _route(h, "GET", "/api/v1/admin/timers/sweeper"),
    "usage": lambda h: _route(h, "GET", "/api/v1/usage"),
    "binary": _binary,
    "frames": _frames,
    "conflation": _conflation,
    "monitoring": lambda h: _route(h, "GET", "/api/v1/status"),
    "traces": lambda h: _route(h, "GET", "/api/v1/traces/names"),
    "consumer-groups": lambda h: _route(h, "GET", "/api/v1/consumer-groups"),
    "reads": lambda h: _route(h, "POST", "/api/v1/fetch", json={"entries": [], "maxBytes": 1024}),
}


_SEEN: dict[tuple[str, str], Probe] = {}


def probe(feature: str, http: httpx.Client) -> Probe:
    """The feature's probe, sent once per broker URL and run (the answer is kept)."""
    key = (str(http.base_url), feature)
    if key not in _SEEN:
        _SEEN[key] = PROBES[feature](http)
    return _SEEN[key]
