"""The broker's own fuzzer: seeded, over every route, in the default run.

``test_fuzz_every_route``: >= 10,000 hostile requests against a dedicated broker and database, sent by a
raw HTTP/1.1 client (so a path may carry NUL or non-UTF-8 bytes and a body may lack a Content-Type):
wrong types, deep nesting, huge and negative numbers, out-of-range dates, NUL and non-UTF-8 bytes,
missing or wrong content types, duplicate JSON keys, oversized bodies, now and then a malformed request
line. Asserted: no 5xx, every 4xx in the envelope, and - for every chunk of concurrent requests that
were all refused (or only read) - every table's row count and checksum unchanged.

``test_parsers_raise_only_api_errors``: Hypothesis drives arbitrary JSON into the body parsers of
every surface in-process: they may refuse, never raise anything but an ``ApiError``.

Reproduce a failing run with ``QUEEN_FUZZ_SEED=<seed printed in the failure>``; size it with
``QUEEN_FUZZ_REQUESTS``.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import re
import time
import urllib.parse
import uuid
from collections import Counter
from dataclasses import dataclass

import asyncpg
import pytest

from broker.http.wire import MAX_JSON_DEPTH

N_REQUESTS = int(os.environ.get("QUEEN_FUZZ_REQUESTS", "10000"))
CONCURRENCY = 24
CHUNK = int(os.environ.get("QUEEN_FUZZ_CHUNK", "500"))
REPLAY = int(os.environ.get("QUEEN_FUZZ_REPLAY", "3000"))
MAX_BODY = 64 * 1024

# (method, template, role): role "body" routes take a JSON body, "read" routes change nothing when they
# answer 2xx (any other 2xx starts a new table baseline).
ROUTES: list[tuple[str, str, str]] = [
    ("GET", "/health", "read"), ("GET", "/api/v1/health", "read"), ("GET", "/metrics", "read"),
    ("GET", "/metrics/prometheus", "read"), ("GET", "/api/v1/whoami", "read"),
    ("GET", "/api/v1/admin/ping", "read"), ("POST", "/api/v1/admin/ping", "read"),
    ("GET", "/api/v1/test/sleep", "read"),
    ("GET", "/api/v1/admin/tenants/{tenant}/plan", "read"), ("PUT", "/api/v1/admin/tenants/{tenant}/plan", "body"),
    ("DELETE", "/api/v1/admin/tenants/{tenant}/plan", "write"),
    ("GET", "/api/v1/admin/tenants/{tenant}/timers-paused", "read"),
    ("POST", "/api/v1/admin/tenants/{tenant}/timers-paused", "switch"),
    ("GET", "/api/v1/admin/cluster/suspended", "read"), ("POST", "/api/v1/admin/cluster/suspended", "switch"),
    ("GET", "/api/v1/admin/kv", "read"), ("POST", "/api/v1/admin/kv", "switch"),
    ("GET", "/api/v1/admin/timers/sweeper", "read"), ("POST", "/api/v1/admin/timers/sweeper", "switch"),
    ("GET", "/api/v1/admin/timers/scheduling", "read"), ("POST", "/api/v1/admin/timers/scheduling", "switch"),
    ("POST", "/api/v1/kv", "body"), ("GET", "/api/v1/kv/{ns}/{key}", "read"),
    ("PUT", "/api/v1/kv/{ns}/{key}", "body"), ("DELETE", "/api/v1/kv/{ns}/{key}", "write"),
    ("POST", "/api/v1/push", "body"), ("GET", "/api/v1/pop/queue/{queue}", "write"),
    ("GET", "/api/v1/pop/queue/{queue}/partition/{partition}", "write"), ("GET", "/api/v1/pop", "write"),
    ("POST", "/api/v1/ack", "body"), ("POST", "/api/v1/ack/batch", "body"),
    ("POST", "/api/v1/lease/{lease}/extend", "body"), ("GET", "/api/v1/dlq", "read"),
    ("POST", "/api/v1/dlq/{id}/replay", "body"), ("GET", "/api/v1/messages/lookup", "read"),
    ("GET", "/api/v1/messages/{pid}/{txn}", "read"), ("POST", "/api/v1/configure", "body"),
    ("GET", "/api/v1/resources/queues", "read"), ("GET", "/api/v1/resources/queues/{queue}", "read"),
    ("DELETE", "/api/v1/resources/queues/{queue}", "write"),
    ("POST", "/api/v1/test/timers/fail", "body"), ("POST", "/api/v1/test/timers/hold", "body"),
    ("POST", "/api/v1/test/timers/release", "body"),
    ("POST", "/api/v1/timers", "body"), ("GET", "/api/v1/timers/{queue}", "read"),
    ("GET", "/api/v1/timers/{queue}/{timerKey}", "read"), ("DELETE", "/api/v1/timers/{queue}/{timerKey}", "write"),
    ("POST", "/api/v1/transaction", "body"), ("GET", "/api/v1/usage", "read"), ("GET", "/api/v1/admin/usage", "read"),
    ("GET", "/api/v1/timers-overview", "read"), ("GET", "/console", "read"), ("GET", "/console/", "read"),
    ("GET", "/console/{asset}", "read"), ("GET", "/console/vendor/uplot/{file}", "read"), ("GET", "/openapi.json", "read"),
    # the official client's admin and read surfaces
    ("GET", "/api/v1/consumer-groups", "read"), ("GET", "/api/v1/consumer-groups/lagging", "read"),
    ("GET", "/api/v1/consumer-groups/{group}", "read"), ("DELETE", "/api/v1/consumer-groups/{group}", "write"),
    ("DELETE", "/api/v1/consumer-groups/{group}/queues/{queue}", "write"),
    ("POST", "/api/v1/consumer-groups/{group}/queues/{queue}/seek", "body"),
    ("POST", "/api/v1/consumer-groups/{group}/subscription", "body"), ("POST", "/api/v1/stats/refresh", "body"),
    ("GET", "/api/v1/resources/overview", "read"), ("GET", "/api/v1/resources/namespaces", "read"),
    ("GET", "/api/v1/resources/tasks", "read"), ("GET", "/api/v1/resources/partitions", "read"),
    ("GET", "/api/v1/resources/queues/{queue}/depth", "read"), ("GET", "/api/v1/status", "read"), ("GET", "/api/v1/status/live", "read"),
    ("GET", "/api/v1/status/queues", "read"), ("GET", "/api/v1/status/queues/{queue}", "read"),
    ("GET", "/api/v1/status/analytics", "read"), ("GET", "/api/v1/analytics/system-metrics", "read"),
    ("GET", "/api/v1/analytics/worker-metrics", "read"), ("GET", "/api/v1/messages", "read"),
    ("DELETE", "/api/v1/messages/{pid}/{txn}", "write"), ("POST", "/api/v1/messages/{pid}/{txn}/retry", "body"),
    ("POST", "/api/v1/traces", "body"), ("GET", "/api/v1/traces/names", "read"),
    ("GET", "/api/v1/traces/by-name/{name}", "read"), ("GET", "/api/v1/traces/{pid}/{txn}", "read"),
    ("POST", "/api/v1/fetch", "body"), ("POST", "/api/v1/partitions/changed", "body"),
    # locks and semaphores
    ("POST", "/api/v1/locks", "body"),
    # the streams SDK (docs/protocol.md §11)
    ("POST", "/streams/v1/queries", "body"), ("POST", "/streams/v1/cycle", "body"),
    ("POST", "/streams/v1/state/get", "read"),
    # ephemeral queues (docs/protocol.md §6)
    ("POST", "/api/v1/ephemeral/configure", "body"), ("POST", "/api/v1/ephemeral/reset", "body"),
    ("DELETE", "/api/v1/ephemeral/queue/{queue}", "write"), ("POST", "/api/v1/ephemeral/push", "body"),
    ("GET", "/api/v1/ephemeral/pop", "write"), ("POST", "/api/v1/ephemeral/ack", "body"),
    ("GET", "/api/v1/ephemeral/queues", "read"), ("GET", "/api/v1/ephemeral/queues/{queue}/depth", "read"),
    ("GET", "/api/v1/no/such/route", "read"), ("PATCH", "/api/v1/push", "read"), ("OPTIONS", "/api/v1/kv", "read"),
]

QUERY_KEYS = ["batch", "wait", "timeout", "autoAck", "consumerGroup", "subscriptionMode", "subscriptionFrom",
              "partitions", "namespace", "task", "from", "to", "limit", "offset", "queue", "partition",
              "ttlSeconds", "forever", "ms", "transactionId", "conflation", "after", "prefix", "tenant", "group"]

HOSTILE_STRINGS = [
    "", " ", "a" * 300, "a" * 5000, "\x00", "a\x00b", "\u0000", "\ud7ff", "\U0001f600", "é", "../../etc/passwd",
    "' OR 1=1 --", "%00", "null", "true", "NaN", "Infinity", "-1", "0", "9" * 40, "1e400",
    "9999-12-31T23:59:59-14:00", "0001-01-01T00:00:00+14:00", "10000-01-01", "2026-13-45T25:61:61Z",
    "-infinity", "infinity", "2026-01-01T00:00:00Z", "now", str(uuid.uuid4()), "00000000-0000-0000-0000-000000000000",
    "not-a-uuid", "__proto__", "{}", "[]", "\\", '"', "\r\n", "\t",
]
HOSTILE_NUMBERS = [0, -1, 1, 2**31, 2**31 - 1, -(2**31), 2**53, 2**63, -(2**63) - 1, 2**64, 10**30, -(10**30),
                   1.5, -0.0, 1e308, -1e308, 5e-324, 256, 257, 10_000, 10_001, 86_400_000 * 400]


@dataclass
class Sent:
    method: str
    template: str
    role: str
    raw: bytes
    index: int


def tag_of(index: int) -> str:
    """Every name a request carries (queue, namespace, key, txn, tenant...) holds this tag, so a row it
    left behind can be traced back to it."""
    return f"z{index:06d}x"


TAG = re.compile(r"z(\d{6})x")


class Generator:
    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    # -- values
    def scalar(self) -> object:
        r = self.rng.random()
        if r < 0.35:
            return self.rng.choice(HOSTILE_STRINGS)
        if r < 0.65:
            return self.rng.choice(HOSTILE_NUMBERS)
        if r < 0.8:
            return self.rng.choice([True, False, None])
        return self.rng.choice(["q-fuzz", "Default", "g1", "ns1", "k1", "completed", "failed", "put", "get", "push",
                                "ack", "schedule", "cancel", "incr", "delete", "getMany", "getPrefix"])

    def value(self, depth: int = 0) -> object:
        r = self.rng.random()
        if depth > 3 or r < 0.5:
            return self.scalar()
        if r < 0.75:
            return [self.value(depth + 1) for _ in range(self.rng.randrange(0, 4))]
        return {self.rng.choice(FIELD_NAMES): self.value(depth + 1) for _ in range(self.rng.randrange(0, 5))}

    def mutate(self, doc: object, depth: int = 0) -> object:
        """Replace, drop or add a few fields of a plausible document."""
        if isinstance(doc, dict):
            out = dict(doc)
            for k in list(out):
                r = self.rng.random()
                if r < 0.15:
                    out[k] = self.value()
                elif r < 0.22:
                    del out[k]
                elif depth < 4:
                    out[k] = self.mutate(out[k], depth + 1)
            if self.rng.random() < 0.15:
                out[self.rng.choice(FIELD_NAMES)] = self.value()
            return out
        if isinstance(doc, list):
            items = [self.mutate(x, depth + 1) for x in doc]
            r = self.rng.random()
            if r < 0.1:
                items = items * self.rng.choice([2, 50, 300])
            elif r < 0.15:
                items = []
            return items
        return self.value() if self.rng.random() < 0.2 else doc

    # -- bodies
    def body_for(self, template: str, role: str, tag: str) -> tuple[bytes, str | None]:
        rng = self.rng
        r = rng.random()
        if role == "switch":  # never a valid switch: a well-formed one would change global state
            doc = rng.choice([{"paused": "yes"}, {"enabled": 1}, {"suspended": None}, {"x": True, "enabled": True},
                              [True], {"paused": [True]}, {"sweeper": {"paused": 0}}])
        else:
            doc = self.mutate(skeleton(template, rng, tag))
        if template in ("/api/v1/push", "/api/v1/transaction") and r < 0.3:
            return self.binary_body(template, tag), "application/x-queen-push"
        ctype = rng.choice(["application/json"] * 6 + ["application/json; charset=utf-8", None, "text/plain",
                                                           "application/octet-stream", "application/x-queen-push",
                                                           "application/vnd.x+json", "multipart/form-data", ";;;"])
        if r < 0.06:
            return deep_text(rng.choice([MAX_JSON_DEPTH - 2, MAX_JSON_DEPTH + 1, 254, 255, 600, 1024, 1030])), ctype
        if r < 0.10:
            return rng.randbytes(rng.randrange(1, 200)), ctype
        if r < 0.13:
            text = json.dumps(doc)
            return (text[:-1] + ', "queue": 1, "queue": "dup"}' if text.endswith("}") else text).encode(), ctype
        if r < 0.16:
            return json.dumps(doc).encode() + b"\x00", ctype
        if r < 0.19:
            return json.dumps(doc).encode().replace(b'"', b'"\xff\xfe', 1), ctype
        if r < 0.21:
            return b'{"a": "' + b"x" * (MAX_BODY + rng.randrange(1, 5000)) + b'"}', ctype
        if r < 0.24:
            return b"", ctype
        if r < 0.27:
            return rng.choice([b"1e400", b"-1e400", b"123456789012345678901234567890", b"NaN", b"[1,]",
                               b'{"a":1}{"b":2}', b"\xef\xbb\xbf{}", b'"\\ud800"', b'{"a":"\\u0000"}']), ctype
        return json.dumps(doc, ensure_ascii=rng.random() < 0.5).encode(), ctype

    def binary_body(self, template: str, tag: str) -> bytes:
        """The client's binary push/transaction body (docs/protocol.md §1.9-1.10), most often damaged:
        truncated, a byte flipped, a length or count made huge, junk appended, the magic changed."""
        from queen.http.push_binary import (
            PushBatch,
            encode_push_binary,
            encode_push_frames,
            encode_transaction_frames,
        )

        rng = self.rng
        n = rng.randrange(0, 4)
        batch = PushBatch(f"q-{tag}", f"p-{tag}", [json.dumps(self.value()).encode() for _ in range(n)],
                          [rng.choice(["", f"t-{tag}-{i}"]) for i in range(n)])
        if template == "/api/v1/transaction":
            head = json.dumps(self.mutate({"operations": [], "requiredLeases": []})).encode()
            body = bytearray(encode_transaction_frames(head, [batch], counts=rng.random() < 0.2))
        else:
            body = bytearray(rng.choice([encode_push_binary, encode_push_frames])([batch]))
        r = rng.random()
        if r < 0.2 or not body:
            return bytes(body)
        if r < 0.4:
            return bytes(body[:rng.randrange(0, len(body))])
        if r < 0.55:
            # Never inside a tag: a flipped digit makes another request's tag, and the push it still is
            # would leave rows that phase 1 blames on that (refused) request.
            tags = [range(m.start(), m.end()) for m in TAG.finditer(body.decode("latin-1"))]
            body[rng.choice([i for i in range(len(body)) if not any(i in t for t in tags)])] ^= 1 << rng.randrange(8)
        elif r < 0.75 and len(body) > 9:
            at = rng.randrange(5, len(body) - 3)
            body[at:at + 4] = rng.choice([b"\xff\xff\xff\xff", b"\x00\x00\x00\x80", b"\x10\x27\x00\x00"])
        elif r < 0.85:
            body += rng.randbytes(rng.randrange(1, 40))
        else:
            body[:5] = rng.choice([b"QPB1\xff", b"QTB1\x00", b"QPB1\x01", b"QPF1\x01", b"\x00\x00\x00\x00\x00"])
        return bytes(body)

    def path_param(self, name: str, tag: str) -> str:
        rng = self.rng
        r = rng.random()
        if r < 0.5:
            return {"tenant": f"te-{tag}", "ns": tag, "key": f"k-{tag}/a", "queue": f"q-{tag}", "partition": f"p-{tag}",
                    "lease": str(uuid.uuid4()), "id": str(uuid.uuid4()), "pid": str(uuid.uuid4()), "txn": f"t-{tag}",
                    "timerKey": f"k-{tag}", "asset": "app.js", "file": "uPlot.min.css", "group": f"g-{tag}", "name": f"n-{tag}"}.get(name, "x")
        return urllib.parse.quote(str(self.scalar()) or "x", safe="")

    def query(self) -> str:
        rng = self.rng
        params = []
        for _ in range(rng.randrange(0, 5)):
            k = rng.choice(QUERY_KEYS)
            v = str(self.scalar())
            params.append((k, v))
        keys = {k for k, _ in params}
        if "wait" in keys:  # a long poll must not outlive the request budget
            params = [(k, v) for k, v in params if k != "timeout"] + [("timeout", str(rng.randrange(0, 200)))]
        if "ms" in keys:
            params = [(k, v) for k, v in params if k != "ms"] + [("ms", "5")]
        return urllib.parse.urlencode(params) if params else ""

    def request(self, index: int) -> Sent:
        rng = self.rng
        tag = tag_of(index)
        method, template, role = rng.choice(ROUTES)
        if template.startswith(("/metrics", "/openapi", "/console")) and rng.random() < 0.8:  # ~30 ms each to render: fuzzed less often
            method, template, role = rng.choice(ROUTES)
        path = template
        for name in ("tenant", "ns", "key", "queue", "partition", "lease", "id", "pid", "txn", "timerKey", "asset", "file"):
            if "{" + name + "}" in path:
                path = path.replace("{" + name + "}", self.path_param(name, tag))
        qs = self.query()
        target = (path + ("?" + qs if qs else "")).encode()
        headers = [b"Host: fuzz"]
        body = b""
        if method in ("POST", "PUT") or rng.random() < 0.05:
            body, ctype = self.body_for(template, role, tag)
            if ctype is not None:
                headers.append(b"Content-Type: " + ctype.encode())
        if "/kv/" in template and rng.random() < 0.3:
            headers.append(rng.choice([b'If-Match: "1"', b"If-None-Match: *", b'If-Match: "x"', b"If-Match: W/\"-1\"",
                                       b'If-None-Match: "99999999999999999999999"']))
        r = rng.random()
        if r < 0.015:  # protocol level: the connection's own parser refuses it
            raw = rng.choice([b"GET /a\x00b HTTP/1.1\r\nHost: x\r\n\r\n", b"GET /\xff\xfe HTTP/1.1\r\nHost: x\r\n\r\n",
                              b"POST /api/v1/push HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n",
                              b"GET /health HTTP/7.0\r\nHost: x\r\n\r\n", b"BREW /health HTTP/1.1\r\nHost: x\r\n\r\n",
                              b"POST /api/v1/kv HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"])
            return Sent(method, template, "protocol", raw, index)
        if r < 0.03:
            target = target.replace(b"/api", b"/api\xc3\xa9", 1) if rng.random() < 0.5 else target + b"%00%ff"
        head = b"%s %s HTTP/1.1\r\n" % (method.encode(), target) + b"\r\n".join(headers)
        head += b"\r\nContent-Length: %d\r\n\r\n" % len(body)
        return Sent(method, template, role, head + body, index)


FIELD_NAMES = ["queue", "partition", "payload", "items", "operations", "op", "ns", "key", "keys", "value", "type",
               "transactionId", "partitionId", "leaseId", "consumerGroup", "status", "acknowledgments", "options",
               "delayMs", "timerKey", "txn", "ttlSeconds", "forever", "expect", "delta", "tenant", "traceId",
               "deadlineMs", "requiredLeases", "kv", "timers", "echo", "prefix", "limit", "after", "error",
               "messages", "acks", "id", "group", "maxLength", "maxBytes", "policy", "windowBuffer",
               "name", "source_queue", "sink_queue", "config_hash", "reset", "query_id", "partition_id",
               "consumer_group", "state_ops", "push_items", "ack", "count", "release_lease", "key_prefix",
               "ripe_at_or_before", "owner", "token", "slot"]


def skeleton(template: str, rng: random.Random, tag: str) -> object:
    """A plausible body for the route, every name in it carrying the request's tag."""
    q = f"q-{tag}"
    pid = str(uuid.uuid4())
    ack = {"transactionId": f"t-{tag}", "partitionId": pid, "status": "completed", "leaseId": str(uuid.uuid4()),
           "consumerGroup": f"g-{tag}"}
    kv_op = rng.choice([{"op": "put", "ns": tag, "key": f"k-{tag}", "value": {"v": tag}, "ttlSeconds": 60},
                        {"op": "get", "ns": tag, "key": "k1"}, {"op": "incr", "ns": tag, "key": f"c-{tag}", "delta": 1,
                                                               "forever": True},
                        {"op": "getMany", "ns": tag, "keys": ["a", "b"]}, {"op": "getPrefix", "ns": tag, "prefix": "k"},
                        {"op": "delete", "ns": tag, "key": "k1"}])
    timer_op = rng.choice([{"op": "schedule", "queue": q, "timerKey": f"k-{tag}", "delayMs": 60_000, "payload": {"a": tag}},
                           {"op": "cancel", "queue": q, "timerKey": "k1"}])
    push_item = {"queue": q, "partition": f"p-{tag}", "payload": {"n": tag}, "transactionId": f"t-{tag}"}
    lock_op = rng.choice([{"op": "acquire", "name": f"l-{tag}", "ttlSeconds": 60, "owner": f"o-{tag}"},
                          {"op": "acquire", "name": f"l-{tag}", "ttlSeconds": 60, "owner": f"o-{tag}", "limit": 3},
                          {"op": "renew", "name": f"l-{tag}", "token": 1, "ttlSeconds": 60, "slot": 0},
                          {"op": "release", "name": f"l-{tag}", "token": 1}, {"op": "get", "name": f"l-{tag}"}])
    return {
        "/api/v1/push": {"items": [push_item]},
        "/api/v1/ack": ack,
        "/api/v1/ack/batch": {"acknowledgments": [ack, dict(ack)], "consumerGroup": "g1"},
        "/api/v1/kv": {"operations": [kv_op]},
        "/api/v1/locks": {"operations": [lock_op]},
        "/api/v1/kv/{ns}/{key}": {"v": tag},
        "/api/v1/timers": {"operations": [timer_op]},
        "/api/v1/transaction": {"operations": [{"type": "push", "items": [push_item]}, {"type": "ack", **ack}],
                                "requiredLeases": [str(uuid.uuid4())], "kv": [kv_op], "timers": [timer_op]},
        "/api/v1/configure": {"queue": q, "namespace": f"n-{tag}", "task": "t", "options": {"leaseTime": 30, "retryLimit": 3}},
        "/api/v1/admin/tenants/{tenant}/plan": {"max_payload_bytes": 1000, "rate_limit_per_s": 0},
        "/api/v1/admin/ping": {"echo": {"a": [1, 2]}},
        "/api/v1/lease/{lease}/extend": {},
        "/api/v1/dlq/{id}/replay": {},
        "/streams/v1/queries": {"name": f"sq-{tag}", "source_queue": q, "sink_queue": f"s-{tag}", "config_hash": "h",
                                "reset": False},
        "/streams/v1/cycle": {"query_id": str(uuid.uuid4()), "partition_id": pid, "consumer_group": f"g-{tag}",
                              "state_ops": [{"type": "upsert", "key": f"k-{tag}", "value": {"v": tag}},
                                            {"type": "delete", "key": "k1"}],
                              "push_items": [{"queue": q, "partition": f"p-{tag}", "payload": {"n": tag}}],
                              "ack": {"transactionId": f"t-{tag}", "leaseId": str(uuid.uuid4()), "status": "completed",
                                      "count": 1},
                              "release_lease": rng.random() < 0.5},
        "/streams/v1/state/get": {"query_id": str(uuid.uuid4()), "partition_id": pid, "keys": ["a", f"k-{tag}"],
                                  "key_prefix": "k", "ripe_at_or_before": 1000},
        "/api/v1/ephemeral/configure": {"queue": q, "options": {"maxLength": 5, "policy": "dropOldest",
                                                                "windowBuffer": {"ms": 10, "count": 2}}},
        "/api/v1/ephemeral/reset": {"queue": q},
        "/api/v1/ephemeral/push": {"queue": q, "partition": f"p-{tag}", "messages": [{"payload": {"n": tag}}]},
        "/api/v1/ephemeral/ack": {"queue": q, "group": f"g-{tag}", "acks": [{"id": "x.1.1", "status": "retry"}]},
    }.get(template, {"x": 1})


def deep_text(depth: int) -> bytes:
    return ("[" * depth + "1" + "]" * depth).encode()


# ---------------------------------------------------------------- raw client


class RawClient:
    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def _connect(self) -> None:
        self.reader, self.writer = await asyncio.open_connection(self.host, self.port, limit=2**20)

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            try:
                await self.writer.wait_closed()
            except OSError:
                pass
        self.reader = self.writer = None

    async def send(self, raw: bytes, *, head: bool = False) -> tuple[int, dict[str, str], bytes]:
        for attempt in range(2):
            if self.writer is None:
                await self._connect()
            assert self.reader is not None and self.writer is not None
            try:
                self.writer.write(raw)
                await self.writer.drain()
                return await asyncio.wait_for(self._read(head), 10)
            except (ConnectionError, asyncio.IncompleteReadError) as exc:
                await self.close()
                if attempt == 1:
                    raise AssertionError(f"connection failed twice: {exc!r} for {raw[:200]!r}") from exc
        raise AssertionError("unreachable")

    async def _read(self, head: bool) -> tuple[int, dict[str, str], bytes]:
        assert self.reader is not None
        blob = await self.reader.readuntil(b"\r\n\r\n")
        lines = blob.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        headers: dict[str, str] = {}
        for ln in lines[1:]:
            if ":" in ln:
                k, v = ln.split(":", 1)
                headers[k.strip().lower()] = v.strip()
        body = b""
        if head or status in (204, 304):
            pass
        elif "content-length" in headers:
            body = await self.reader.readexactly(int(headers["content-length"]))
        elif headers.get("transfer-encoding", "").lower() == "chunked":
            while True:
                size = int((await self.reader.readuntil(b"\r\n")).strip().split(b";")[0], 16)
                chunk = await self.reader.readexactly(size + 2)
                if size == 0:
                    break
                body += chunk[:-2]
        else:
            body = await self.reader.read()
        if headers.get("connection", "").lower() == "close" or status >= 400 and "content-length" not in headers:
            await self.close()
        return status, headers, body


# ---------------------------------------------------------------- snapshots

SNAPSHOT_SQL = """
SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p') ORDER BY 1
"""
# Rows the broker itself rewrites on a clock, whatever clients do (liveness and leases of the loops).
SELF_MAINTAINED: set[str] = set()


async def snapshot(conn: asyncpg.Connection) -> dict[str, tuple[int, str]]:
    out: dict[str, tuple[int, str]] = {}
    for (name,) in await conn.fetch(SNAPSHOT_SQL):
        if name in SELF_MAINTAINED:
            continue
        row = await conn.fetchrow(
            f'SELECT count(*) AS n, coalesce(md5(string_agg(t::text, \'|\' ORDER BY t::text)), \'\') AS h FROM "{name}" t'
        )
        out[name] = (row["n"], row["h"])
    return out


async def traced_indexes(conn: asyncpg.Connection) -> set[int]:
    """Indexes of the requests whose tag appears in any row of any table."""
    found: set[int] = set()
    for (name,) in await conn.fetch(SNAPSHOT_SQL):
        for (text,) in await conn.fetch(f'SELECT t::text FROM "{name}" t WHERE t::text ~ \'z[0-9]{{6}}x\''):
            found.update(int(m) for m in TAG.findall(text))
    return found


def diff(a: dict[str, tuple[int, str]], b: dict[str, tuple[int, str]]) -> dict[str, tuple]:
    return {k: (a.get(k), b.get(k)) for k in set(a) | set(b) if a.get(k) != b.get(k)}


# ---------------------------------------------------------------- the run


@pytest.fixture
def fuzz_broker(start_broker):
    return start_broker(workers=2, env={
        "QUEEN_MAX_BODY_BYTES": str(MAX_BODY), "QUEEN_MAX_CONNECTIONS": "0", "QUEEN_LOG_LEVEL": "WARNING",
        # the loops stay quiet, so a refused request is the only thing that could change a table
        "QUEEN_SWEEPER_ENABLED": "0", "QUEEN_KV_PRUNE_INTERVAL_MS": "3600000",
        "QUEEN_LOG_RETENTION_INTERVAL_MS": "3600000", "QUEEN_LIMITS_REFRESH_MS": "3600000",
        "QUEEN_EPHEMERAL_EXPIRY_INTERVAL_MS": "3600000",
    })


async def send_all(clients: list[RawClient], batch: list[Sent], failures: list[str]) -> list[tuple[Sent, int]]:
    """Send ``batch`` over the clients' keep-alive connections concurrently; check every answer."""
    queue: asyncio.Queue[Sent] = asyncio.Queue()
    for s in batch:
        queue.put_nowait(s)
    results: list[tuple[Sent, int]] = []

    async def worker(client: RawClient) -> None:
        while not queue.empty():
            s = queue.get_nowait()
            try:
                status, headers, body = await client.send(s.raw, head=s.method == "HEAD")
            except (AssertionError, TimeoutError) as exc:
                failures.append(f"{s.method} {s.template}: {exc!r}")
                await client.close()
                continue
            if s.role == "protocol":
                await client.close()
            # A KV read of a missing key is an answered (and metered) read, not a refusal.
            answered = status == 404 and s.method == "GET" and b'"kv_key_not_found"' in body
            results.append((s, 200 if answered else status))
            problem = _check(status, headers, body)
            if problem:
                failures.append(f"{problem}: {s.raw[:300]!r} -> {status} {body[:300]!r}")

    await asyncio.gather(*(worker(c) for c in clients))
    return results


@pytest.mark.timeout(300)
async def test_fuzz_every_route(fuzz_broker):
    seed = int(os.environ.get("QUEEN_FUZZ_SEED") or random.randrange(2**32))
    rng = random.Random(seed)
    gen = Generator(rng)
    requests = [gen.request(i) for i in range(N_REQUESTS)]
    host, port = fuzz_broker.url.removeprefix("http://").split(":")
    log_mark = fuzz_broker.log_path.stat().st_size
    failures: list[str] = []
    t0 = time.monotonic()
    db = await asyncpg.connect(fuzz_broker.dsn)
    clients = [RawClient(host, int(port)) for _ in range(CONCURRENCY)]
    try:
        # 1. Everything, concurrently. Each request's names carry its tag: no refused request's tag may
        #    appear in any row afterwards.
        results = await send_all(clients, requests, failures)
        fuzz_s = time.monotonic() - t0
        statuses = Counter(st for _, st in results)
        by_route: dict[str, Counter[int]] = {}
        for s, st in results:
            by_route.setdefault(f"{s.method} {s.template}", Counter())[st] += 1
        refused = [s for s, st in results if st >= 400]
        traces = await traced_indexes(db)
        for i in sorted(traces & {s.index for s in refused})[:20]:
            failures.append(f"a refused request left rows behind (tag {tag_of(i)}): {requests[i].raw[:300]!r}")
        traced_accepted = len(traces & {s.index for s, st in results if st < 400})
        # 2. The refused ones again, in chunks, with every table's row count and checksum compared around
        #    each chunk (this also covers what carries no tag: counters, gauges, metering).
        replay = refused[:REPLAY]
        checked = skipped = 0
        before = await snapshot(db)
        for start in range(0, len(replay), CHUNK):
            again = await send_all(clients, replay[start:start + CHUNK], failures)
            after = await snapshot(db)
            if any(st < 400 and s.role not in ("read", "protocol") for s, st in again):
                skipped += 1  # state moved on since phase 1 and one was accepted this time
            else:
                checked += len(again)
                d = diff(before, after)
                if d:
                    sample = [(s.raw[:400], st) for s, st in again[:3]]
                    failures.append(f"tables changed by a chunk of refused requests: {d} (first of the chunk: {sample})")
            before = after
    finally:
        for c in clients:
            await c.close()
        await db.close()
    took = time.monotonic() - t0
    report = (f"seed={seed} requests={len(requests)} (+{len(replay)} replayed) fuzz={fuzz_s:.1f}s total={took:.1f}s "
              f"statuses={dict(sorted(statuses.items()))} refused={len(refused)} "
              f"refused_replayed_and_table_checked={checked} chunks_skipped={skipped} "
              f"accepted_with_rows={traced_accepted}")
    print("\nFUZZ", report)
    assert not failures, report + "\n" + "\n".join(failures[:20])
    assert sum(statuses.values()) == len(requests)
    assert {f"{m} {t}" for m, t, _ in ROUTES} <= set(by_route), "a route was never fuzzed"
    assert checked >= len(replay) // 2, report
    new_log = fuzz_broker.log_path.read_bytes()[log_mark:].decode(errors="replace")
    assert "Traceback" not in new_log and "unhandled error" not in new_log, f"{report}\n{new_log[-3000:]}"


def _check(status: int, headers: dict[str, str], body: bytes) -> str | None:
    if status >= 500:
        return "5xx"
    if status >= 400:
        if not headers.get("content-type", "").startswith("application/json"):
            return "error not in JSON"
        try:
            env = json.loads(body)
        except ValueError:
            return "error body is not JSON"
        if not isinstance(env, dict) or not all(isinstance(env.get(k), str) and env.get(k) for k in ("error", "reason", "detail")):
            return "error not in the envelope"
    return None


def test_the_route_table_is_complete():
    """Every route the app mounts is in ROUTES (a new route is fuzzed from its first commit)."""
    from broker.app import create_app
    from broker.config import Settings

    app = create_app(Settings(), "postgresql://unused/none")
    mounted = set()
    for route in app.router.routes():
        if route.method == "HEAD":
            continue
        canonical = route.resource.canonical if route.resource else ""
        mounted.add((route.method, canonical.replace("{key:.+}", "{key}").replace("{timerKey:.+}", "{timerKey}")))
    fuzzed = {(m, t) for m, t, _ in ROUTES}
    assert mounted <= fuzzed, sorted(mounted - fuzzed)


# ---------------------------------------------------------------- Hypothesis on the parsers

try:
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st
except ImportError:  # pragma: no cover - hypothesis is in the test extra
    given = None

if given is not None:
    json_values = st.recursive(
        st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70)
        | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=20)
        | st.sampled_from(["put", "get", "schedule", "cancel", "push", "ack", "completed", "ns1", "q1", "k1",
                           "acquire", "renew", "release",
                           str(uuid.uuid4()), "2026-01-01T00:00:00Z", "9999-12-31T23:59:59-14:00"]),
        lambda children: st.lists(children, max_size=4)
        | st.dictionaries(st.sampled_from(FIELD_NAMES), children, max_size=6),
        max_leaves=25,
    )

    @settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(body=json_values)
    def test_parsers_raise_only_api_errors(body):
        from broker.errors import ApiError
        from broker.kv.parse import parse_body
        from broker.locks.parse import parse_body as parse_locks
        from broker.log import parse
        from broker.streams import parse as streams_parse
        from broker.timers.parse import parse_ops

        calls = [
            lambda: parse_body(body, max_ops=256),
            lambda: parse_locks(body),
            lambda: parse_ops(body.get("operations") if isinstance(body, dict) else body, max_ops=256),
            lambda: parse.push_items(body.get("items") if isinstance(body, dict) else body, max_payload=1 << 20),
            lambda: parse.ack_item(body, "ack", None),
            lambda: parse.queue_options(body.get("options") if isinstance(body, dict) else body),
            lambda: [parse.ack_item(a, "a", None, {}) for a in (body if isinstance(body, list) else [body])],
            lambda: streams_parse.registration(body if isinstance(body, dict) else {"name": body}),
            lambda: streams_parse.cycle(body if isinstance(body, dict) else {"state_ops": body}, 1 << 20),
            lambda: streams_parse.state_query(body if isinstance(body, dict) else {"keys": body}),
        ]
        for call in calls:
            try:
                call()
            except ApiError:
                pass

    @settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(raw=st.binary(max_size=300), magic=st.sampled_from([b"", b"QPB1", b"QTB1"]),
           flags=st.integers(min_value=0, max_value=255))
    def test_binary_decoders_raise_only_api_errors(raw, magic, flags):
        from broker.errors import ApiError
        from broker.http import binary

        body = magic + bytes([flags]) + raw if magic else raw
        for decode in (binary.decode_push, binary.decode_transaction):
            try:
                decode(body, max_payload=1 << 20)
            except ApiError:
                pass
