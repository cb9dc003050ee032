"""Mutants: a small aiohttp reverse proxy in front of a real broker that breaks ONE contract at a time.

The suite must be able to fail. Each mutant is a plausible bug (an ``ok: true`` on absent, a dropped
header, a silently accepted server-owned field...) applied on the wire between the suite and a correct
broker; the gate test (tests/test_conformance_gate.py) runs the tests tagged with the contracts a mutant
breaks through the proxy and asserts that those contracts are reported FAILED.

    python -m conformance.mutants --target http://127.0.0.1:6632 --mutant absent-ok-true --port 7000
    python -m conformance.mutants --list
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web
from yarl import URL

HOP = {"host", "content-length", "transfer-encoding", "connection", "keep-alive", "content-encoding"}
TIMERS = "/api/v1/timers"
OWNED = ("producerSub", "producer_sub", "messageId", "message_id", "tenant", "tenantId", "tenant_id")


@dataclass
class Req:
    method: str
    path: str  # raw path, without the query string
    query: dict[str, str]
    raw_query: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        try:
            return json.loads(self.body) if self.body else None
        except ValueError:
            return None

    def set_json(self, obj: Any) -> None:
        self.body = json.dumps(obj).encode()
        self.headers["Content-Type"] = "application/json"


@dataclass
class Resp:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        try:
            return json.loads(self.body) if self.body else None
        except ValueError:
            return None

    def set_json(self, obj: Any) -> None:
        self.body = json.dumps(obj).encode()
        self.headers["Content-Type"] = "application/json"


def error(status: int, code: str, reason: str, detail: str) -> Resp:
    return Resp(status, {"Content-Type": "application/json"},
                json.dumps({"error": code, "reason": reason, "detail": detail}).encode())


RequestHook = Callable[[Req, dict[str, Any]], "Req | Resp"]
ResponseHook = Callable[[Req, Resp, dict[str, Any]], Resp]


@dataclass
class Mutant:
    name: str
    breaks: tuple[str, ...]
    bug: str
    on_request: RequestHook | None = None
    on_response: ResponseHook | None = None
    state: dict[str, Any] = field(default_factory=dict)
    # True: the proxy stands in front of the deployment's SECOND broker only (the suite gets the first broker
    # directly and the proxy as the second --url): a bug one broker of a deployment has, the others not.
    second_only: bool = False
    # extra arguments for the suite's run (e.g. a shorter --fire-timeout where the bug shows as a wait)
    suite_args: tuple[str, ...] = ()


def _is_timer_item(path: str) -> bool:
    """/api/v1/timers/{queue}/{key...}: peek or DELETE cancel."""
    return path.startswith(TIMERS + "/") and path[len(TIMERS) + 1:].count("/") >= 1


def _is_timer_list(path: str) -> bool:
    rest = path[len(TIMERS) + 1:] if path.startswith(TIMERS + "/") else None
    return rest is not None and rest != "" and "/" not in rest


def _timer_results(resp: Resp) -> list[dict[str, Any]]:
    """The result elements of a timers answer: the DELETE object or the POST results."""
    data = resp.json()
    if isinstance(data, dict) and isinstance(data.get("results"), list):
        return [r for r in data["results"] if isinstance(r, dict)]
    if isinstance(data, dict) and "status" in data:
        return [data]
    return []


def _rewrite_results(resp: Resp, fn: Callable[[dict[str, Any]], None]) -> Resp:
    data = resp.json()
    if isinstance(data, dict) and isinstance(data.get("results"), list):
        for r in data["results"]:
            if isinstance(r, dict):
                fn(r)
        resp.set_json(data)
    elif isinstance(data, dict) and "status" in data:
        fn(data)
        resp.set_json(data)
    return resp


# ------------------------------------------------------------------------------------------ the bugs


def absent_ok_true(req: Req, resp: Resp, st: dict[str, Any]) -> Resp:
    if req.path.startswith(TIMERS):
        _rewrite_results(resp, lambda r: r.update(ok=True) if r.get("status") == "absent" else None)
    return resp


def hint_dropped(req: Req, resp: Resp, st: dict[str, Any]) -> Resp:
    resp.headers = {k: v for k, v in resp.headers.items() if k.lower() != "x-queen-timers-hint"}
    return resp


def owned_fields_stripped(req: Req, st: dict[str, Any]) -> Req:
    data = req.json()
    if req.method == "POST" and req.path == TIMERS and isinstance(data, dict) and isinstance(data.get("operations"), list):
        for op in data["operations"]:
            if isinstance(op, dict):
                for k in list(op):
                    if k in OWNED or k.startswith("_"):
                        del op[k]
        req.set_json(data)
    return req


def eph_nack_reads_acked(req: Req, resp: Resp, st: dict[str, Any]) -> Resp:
    """An ephemeral ack that reports a nack's redelivery as acked (the client would drop its retry)."""
    data = resp.json()
    if req.path == "/api/v1/ephemeral/ack" and isinstance(data, dict) and isinstance(data.get("results"), list):
        for r in data["results"]:
            if isinstance(r, dict) and r.get("outcome") == "redelivered":
                r["outcome"] = "acked"
        resp.set_json(data)
    return resp


def list_limit_rejected(req: Req, st: dict[str, Any]) -> Req | Resp:
    if req.method == "GET" and _is_timer_list(req.path) and "limit" in req.query:
        try:
            n = int(req.query["limit"])
        except ValueError:
            n = -1
        if not 1 <= n <= 1000:
            return error(400, "timers_bad_request", "timers_bad_limit", "limit must be between 1 and 1000")
    return req


def too_late_409(req: Req, resp: Resp, st: dict[str, Any]) -> Resp:
    if req.path.startswith(TIMERS) and any(r.get("status") == "too_late" for r in _timer_results(resp)):
        return error(409, "timers_conflict", "too_late", "the timer is claimed by a firing broker")
    return resp


def retry_after_dropped(req: Req, resp: Resp, st: dict[str, Any]) -> Resp:
    if resp.status == 429:
        resp.headers = {k: v for k, v in resp.headers.items() if k.lower() != "retry-after"}
    return resp


def reason_removed(req: Req, resp: Resp, st: dict[str, Any]) -> Resp:
    data = resp.json()
    if resp.status >= 400 and isinstance(data, dict) and "reason" in data:
        del data["reason"]
        resp.set_json(data)
    return resp


def peek_miss_404(req: Req, resp: Resp, st: dict[str, Any]) -> Resp:
    data = resp.json()
    if req.method == "GET" and _is_timer_item(req.path) and isinstance(data, dict) and data.get("found") is False:
        return error(404, "timer_not_found", "timer_not_found", "no such timer")
    return resp


def kv_remember(req: Req, st: dict[str, Any]) -> Req:
    data = req.json()
    st["last_ops"] = data.get("operations") if req.path == "/api/v1/kv" and isinstance(data, dict) else None
    return req


def kv_expired_returned(req: Req, resp: Resp, st: dict[str, Any]) -> Resp:
    ops = st.get("last_ops")
    data = resp.json()
    if req.path != "/api/v1/kv" or not isinstance(ops, list) or not isinstance(data, dict):
        return resp
    seen: dict[tuple[str, str], Any] = st.setdefault("values", {})
    results = data.get("results") or []
    changed = False
    for op, r in zip(ops, results, strict=False):
        if not isinstance(op, dict) or not isinstance(r, dict):
            continue
        key = (str(op.get("ns")), str(op.get("key")))
        if op.get("op") in ("put", "putIfAbsent") and r.get("applied"):
            seen[key] = op.get("value")
        elif op.get("op") == "delete" and r.get("applied"):
            seen.pop(key, None)
        elif op.get("op") == "get" and r.get("found") is False and key in seen:
            r.update(found=True, value=seen[key], version=1, expiresAt=None)
            changed = True
    if changed:
        resp.set_json(data)
    return resp


def taxonomy_extended(req: Req, resp: Resp, st: dict[str, Any]) -> Resp:
    if req.path.startswith(TIMERS):
        _rewrite_results(resp, lambda r: r.update(status="updated") if r.get("status") == "rescheduled" else None)
    return resp


def message_id_changed(req: Req, resp: Resp, st: dict[str, Any]) -> Resp:
    if req.method == "POST" and req.path == TIMERS:
        _rewrite_results(resp, lambda r: r.update(messageId=str(uuid.uuid4())) if r.get("messageId") else None)
    return resp


def deliver_at_absolute(req: Req, st: dict[str, Any]) -> Req:
    data = req.json()
    if req.method == "POST" and req.path == TIMERS and isinstance(data, dict) and isinstance(data.get("operations"), list):
        now = dt.datetime.now(dt.UTC)
        for op in data["operations"]:
            if not isinstance(op, dict):
                continue
            at = op.pop("deliverAt", None) or op.pop("deliver_at", None)
            secs = op.pop("delaySeconds", None)
            if isinstance(at, str):
                try:
                    when = dt.datetime.fromisoformat(at.replace("Z", "+00:00"))
                    # the bug: the instant becomes a delay on the proxy's clock (kept under a minute so
                    # that no horizon refuses it)
                    op.setdefault("delayMs", max(0, int((when - now).total_seconds() * 1000)) % 60_000)
                except ValueError:
                    pass
            if isinstance(secs, int | float):
                op.setdefault("delayMs", int(secs * 1000))
        req.set_json(data)
    return req


def deadline_ignored(req: Req, st: dict[str, Any]) -> Req:
    data = req.json()
    if req.method == "POST" and req.path == "/api/v1/push" and isinstance(data, dict) and isinstance(data.get("items"), list):
        for item in data["items"]:
            if isinstance(item, dict):
                item.pop("deadlineMs", None)
        req.set_json(data)
    return req


def pop_deadline_restarted(req: Req, resp: Resp, st: dict[str, Any]) -> Resp:
    """The deadline handed out at pop is recomputed from the pop instant (now + deadlineMs) instead of
    the instant fixed at push, so a consumer's last check would act on a deadline its caller never had."""
    data = resp.json()
    if req.path.startswith("/api/v1/pop/") and isinstance(data, dict) and isinstance(data.get("messages"), list):
        for m in data["messages"]:
            if isinstance(m, dict) and m.get("deadlineAt") and m.get("createdAt"):
                at, created = (dt.datetime.fromisoformat(m[k].replace("Z", "+00:00")) for k in ("deadlineAt", "createdAt"))
                later = dt.datetime.now(dt.UTC) + (at - created) + dt.timedelta(milliseconds=1)
                m["deadlineAt"] = later.strftime("%Y-%m-%dT%H:%M:%S.") + f"{later.microsecond // 1000:03d}Z"
        resp.set_json(data)
    return resp


def cancel_via_batch(req: Req, st: dict[str, Any]) -> Req:
    """The DELETE route implemented on top of the batch route: it inherits the schedule authorization."""
    if req.method == "DELETE" and _is_timer_item(req.path):
        from urllib.parse import unquote

        rest = req.path[len(TIMERS) + 1:]
        queue, _, key = rest.partition("/")
        op: dict[str, Any] = {"op": "cancel", "queue": unquote(queue), "timerKey": unquote(key)}
        if "txn" in req.query:
            op["txn"] = req.query["txn"]
        st["unwrap"] = True
        req.method, req.path, req.raw_query, req.query = "POST", TIMERS, "", {}
        req.set_json({"operations": [op]})
    else:
        st["unwrap"] = False
    return req


def cancel_unwrap(req: Req, resp: Resp, st: dict[str, Any]) -> Resp:
    data = resp.json()
    if st.get("unwrap") and resp.status == 200 and isinstance(data, dict) and data.get("results"):
        resp.set_json(data["results"][0])
    return resp


def truncated_lies(req: Req, resp: Resp, st: dict[str, Any]) -> Resp:
    data = resp.json()
    if req.method == "GET" and _is_timer_list(req.path) and isinstance(data, dict) and "truncated" in data:
        data["truncated"] = False
        data["nextAfter"] = None
        resp.set_json(data)
    return resp


def horizon_400(req: Req, resp: Resp, st: dict[str, Any]) -> Resp:
    data = resp.json()
    if resp.status == 403 and isinstance(data, dict) and data.get("error") == "timer_horizon_exceeded":
        return error(400, "timers_bad_request", "timers_delay_too_long", "delayMs is too long")
    return resp


def kv_400_is_500(req: Req, resp: Resp, st: dict[str, Any]) -> Resp:
    if req.path == "/api/v1/kv" and resp.status == 400:
        return error(500, "internal", "internal_error", "unhandled")
    return resp


def route_code_renamed(req: Req, resp: Resp, st: dict[str, Any]) -> Resp:
    data = resp.json()
    if resp.status == 404 and isinstance(data, dict) and data.get("error") == "no_such_route":
        data["error"] = "not_found"
        resp.set_json(data)
    return resp


def kv_delete_absent_404(req: Req, resp: Resp, st: dict[str, Any]) -> Resp:
    data = resp.json()
    if req.path == "/api/v1/kv" and isinstance(data, dict):
        for r in data.get("results") or []:
            if isinstance(r, dict) and r.get("op") == "delete" and r.get("reason") == "absent":
                return error(404, "kv_not_found", "kv_key_absent", "no such key")
    return resp


def txn_remember(req: Req, st: dict[str, Any]) -> Req:
    data = req.json()
    flat = 0
    if req.path == "/api/v1/transaction" and isinstance(data, dict):
        for op in data.get("operations") or []:
            if isinstance(op, dict):
                flat += len(op.get("items") or []) if op.get("type") == "push" else 1
    st["flat_ops"] = flat
    return req


def failed_index_local(req: Req, resp: Resp, st: dict[str, Any]) -> Resp:
    """The classic bug: failedIndex counted inside the kv array instead of the flat result space."""
    data = resp.json()
    if req.path == "/api/v1/transaction" and isinstance(data, dict) and data.get("reason") == "kv_precondition":
        if isinstance(data.get("failedIndex"), int):
            data["failedIndex"] -= st.get("flat_ops", 0)
            resp.set_json(data)
    return resp


def pop_reversed(req: Req, resp: Resp, st: dict[str, Any]) -> Resp:
    """Due timers enter the log in schedule order instead of expiry order (seen as reversed pops)."""
    data = resp.json()
    if req.path.startswith("/api/v1/pop/") and isinstance(data, dict) and isinstance(data.get("messages"), list):
        data["messages"].reverse()
        resp.set_json(data)
    return resp


def deliver_at_promised_late(req: Req, resp: Resp, st: dict[str, Any]) -> Resp:
    """The frame arrives before the promised instant: the schedule answer names a deliverAt 1 s later
    than the one the broker keeps (equivalently, the broker fires a second early)."""
    def later(r: dict[str, Any]) -> None:
        if isinstance(r.get("deliverAt"), str):
            when = dt.datetime.fromisoformat(r["deliverAt"].replace("Z", "+00:00")) + dt.timedelta(seconds=1)
            r["deliverAt"] = when.strftime("%Y-%m-%dT%H:%M:%S.%fZ")

    if req.method == "POST" and req.path == TIMERS:
        _rewrite_results(resp, later)
    return resp


def cancel_fake(req: Req, st: dict[str, Any]) -> Req | Resp:
    """DELETE answers cancelled without withdrawing anything."""
    if req.method == "DELETE" and _is_timer_item(req.path):
        from urllib.parse import unquote

        queue, _, key = req.path[len(TIMERS) + 1:].partition("/")
        return Resp(200, {"Content-Type": "application/json"}, json.dumps(
            {"ok": True, "status": "cancelled", "queue": unquote(queue), "timerKey": unquote(key),
             "txn": req.query.get("txn")}).encode())
    return req


def tenant_ignored(req: Req, st: dict[str, Any]) -> Req:
    """Tenant isolation lost: every call runs under the first credential the broker saw."""
    key = next((k for k in req.headers if k.lower() == "authorization"), None)
    if key is not None:
        first = st.setdefault("auth", req.headers[key])
        req.headers[key] = first
    return req


def producer_sub_rewritten(req: Req, resp: Resp, st: dict[str, Any]) -> Resp:
    """The delivered frame does not carry the scheduler's authenticated sub."""
    data = resp.json()
    if isinstance(data, dict) and (req.path.startswith("/api/v1/pop/") or req.path == "/api/v1/messages/lookup"):
        if data.get("producerSub"):
            data["producerSub"] = "billing-service"
        for m in data.get("messages") or []:
            if isinstance(m, dict) and m.get("producerSub"):
                m["producerSub"] = "billing-service"
        resp.set_json(data)
    return resp


# ------------------------------------------------------------------------------------------ message log bugs

PUSH = "/api/v1/push"
POP = "/api/v1/pop/"
DAY_MS = 86_400_000


def _is_ack(path: str) -> bool:
    return path in ("/api/v1/ack", "/api/v1/ack/batch")


def _set_query(req: Req, query: dict[str, str]) -> None:
    from urllib.parse import urlencode

    req.query = query
    req.raw_query = urlencode(query)


def push_duplicate_queued(req: Req, resp: Resp, st: dict[str, Any]) -> Resp:
    """Dedupe lost: a repeated (partition, transactionId) is answered (and counted) as a new message."""
    data = resp.json()
    if req.path == PUSH and isinstance(data, list):
        for r in data:
            if isinstance(r, dict) and r.get("status") == "duplicate":
                r.update(status="queued", message_id=str(uuid.uuid4()))
        resp.set_json(data)
    return resp


def push_results_reversed(req: Req, resp: Resp, st: dict[str, Any]) -> Resp:
    """The push answer in completion order rather than item order."""
    data = resp.json()
    if req.path == PUSH and isinstance(data, list) and len(data) > 1:
        data.reverse()
        resp.set_json(data)
    return resp


def push_unknown_field_dropped(req: Req, st: dict[str, Any]) -> Req:
    """Unknown push item keys silently dropped instead of refused."""
    data = req.json()
    known = {"queue", "partition", "payload", "transactionId", "traceId", "deadlineMs"}
    if req.method == "POST" and req.path == PUSH and isinstance(data, dict) and isinstance(data.get("items"), list):
        for it in data["items"]:
            if isinstance(it, dict):
                for k in [k for k in it if k not in known and k not in OWNED and not k.startswith("_")]:
                    del it[k]
        req.set_json(data)
    return req


def pop_empty_200(req: Req, resp: Resp, st: dict[str, Any]) -> Resp:
    if req.path.startswith(POP) and resp.status == 204:
        return Resp(200, {"Content-Type": "application/json"}, b'{"messages": []}')
    return resp


def pop_query_dropped(param: str) -> RequestHook:
    def hook(req: Req, st: dict[str, Any]) -> Req:
        if req.method == "GET" and req.path.startswith(POP) and param in req.query:
            _set_query(req, {k: v for k, v in req.query.items() if k != param})
        return req
    return hook


def binary_body_refused(req: Req, st: dict[str, Any]) -> Req | Resp:
    """A broker that does not know the binary bodies (docs/protocol.md §1.9): 400, as before 0014."""
    ctype = next((v for k, v in req.headers.items() if k.lower() == "content-type"), "")
    if req.method == "POST" and ctype.startswith("application/x-queen-push"):
        body = {"error": "bad_request", "reason": "binary_body_unsupported", "detail": "no binary bodies here"}
        return Resp(400, {"Content-Type": "application/json"}, json.dumps(body).encode())
    return req


def pop_wait_ignored(req: Req, st: dict[str, Any]) -> Req:
    if req.method == "GET" and req.path.startswith(POP) and req.query.get("wait") == "true":
        _set_query(req, {**req.query, "wait": "false"})
    return req


def ack_refusal_409(req: Req, resp: Resp, st: dict[str, Any]) -> Resp:
    """A refused ack answered as an HTTP error instead of a per-item success: false."""
    data = resp.json()
    if _is_ack(req.path) and isinstance(data, list) and any(isinstance(r, dict) and r.get("success") is False for r in data):
        return error(409, "conflict", "lease_invalid", "Invalid or expired lease")
    return resp


def ack_lease_unchecked(req: Req, resp: Resp, st: dict[str, Any]) -> Resp:
    """The lease is not checked: an ack under a wrong or expired lease reports success."""
    data = resp.json()
    if _is_ack(req.path) and isinstance(data, list):
        for r in data:
            if isinstance(r, dict) and r.get("error") == "Invalid or expired lease":
                r.update(success=True, error=None)
        resp.set_json(data)
    return resp


def delivery_attempt_stuck(req: Req, resp: Resp, st: dict[str, Any]) -> Resp:
    data = resp.json()
    if req.path.startswith(POP) and isinstance(data, dict):
        for m in data.get("messages") or []:
            if isinstance(m, dict) and "deliveryAttempt" in m:
                m["deliveryAttempt"] = 1
        resp.set_json(data)
    return resp


def nack_completes(req: Req, st: dict[str, Any]) -> Req:
    """failed / retry settled as completed: a nack never redelivers."""
    data = req.json()
    if req.method == "POST" and _is_ack(req.path) and isinstance(data, dict):
        items = data.get("acknowledgments") if req.path.endswith("/batch") else [data]
        for it in items or []:
            if isinstance(it, dict) and it.get("status") in ("failed", "retry", False):
                it["status"] = "completed"
        req.set_json(data)
    return req


def lease_extend_fake(req: Req, st: dict[str, Any]) -> Req | Resp:
    """Extend answered from the proxy: success with a new expiry, the lease itself untouched."""
    if req.method == "POST" and req.path.startswith("/api/v1/lease/") and req.path.endswith("/extend"):
        lease = req.path[len("/api/v1/lease/"):-len("/extend")]
        until = (dt.datetime.now(dt.UTC) + dt.timedelta(seconds=60)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        return Resp(200, {"Content-Type": "application/json"}, json.dumps(
            {"leaseId": lease, "success": True, "renewed": 1, "newExpiresAt": until, "expiresAt": until,
             "lease_expires_at": until}).encode())
    return req


def dlq_group_filter_ignored(req: Req, st: dict[str, Any]) -> Req:
    if req.method == "GET" and req.path == "/api/v1/dlq" and "consumerGroup" in req.query:
        _set_query(req, {k: v for k, v in req.query.items() if k != "consumerGroup"})
    return req


def lookup_miss_404(req: Req, resp: Resp, st: dict[str, Any]) -> Resp:
    data = resp.json()
    if req.path == "/api/v1/messages/lookup" and isinstance(data, dict) and data.get("found") is False:
        return error(404, "message_not_found", "message_not_found", "no such message")
    return resp


def retention_ignored(req: Req, st: dict[str, Any]) -> Req:
    """The retention options accepted and stored nowhere."""
    data = req.json()
    if req.method == "POST" and req.path == "/api/v1/configure" and isinstance(data, dict) \
            and isinstance(data.get("options"), dict):
        for k in ("retentionSeconds", "completedRetentionSeconds"):
            data["options"].pop(k, None)
        req.set_json(data)
    return req


def group_namespaced_per_broker(req: Req, st: dict[str, Any]) -> Req:
    """Leases kept per broker process: this broker's consumer groups are not the deployment's."""
    if req.method == "GET" and req.path.startswith(POP):
        _set_query(req, {**req.query, "consumerGroup": req.query.get("consumerGroup", "__QUEUE_MODE__") + "@b2"})
    data = req.json()
    if req.method == "POST" and _is_ack(req.path) and isinstance(data, dict):
        items = data.get("acknowledgments") if req.path.endswith("/batch") else [data]
        for it in items or []:
            if isinstance(it, dict):
                it["consumerGroup"] = (it.get("consumerGroup") or "__QUEUE_MODE__") + "@b2"
        req.set_json(data)
    if req.method == "POST" and req.path.startswith("/api/v1/lease/"):
        return Resp(200, {"Content-Type": "application/json"},
                    b'{"success": false, "renewed": 0, "error": "Invalid or expired lease"}')
    return req


# ------------------------------------------------------------------------------------------ edges off by one


def _refuse_at(pred: Callable[[Req, Any], bool], resp: Resp) -> RequestHook:
    def hook(req: Req, st: dict[str, Any]) -> Req | Resp:
        data = req.json()
        if pred(req, data):
            return Resp(resp.status, dict(resp.headers), resp.body)
        return req
    return hook


def _push_items(req: Req, data: Any) -> list[dict[str, Any]]:
    if req.method == "POST" and req.path == PUSH and isinstance(data, dict) and isinstance(data.get("items"), list):
        return [i for i in data["items"] if isinstance(i, dict)]
    return []


def _timer_ops(req: Req, data: Any) -> list[dict[str, Any]]:
    if req.method == "POST" and req.path == TIMERS and isinstance(data, dict) and isinstance(data.get("operations"), list):
        return [o for o in data["operations"] if isinstance(o, dict)]
    return []


def _kv_ops(req: Req, data: Any) -> list[dict[str, Any]]:
    if req.method == "POST" and req.path == "/api/v1/kv" and isinstance(data, dict) and isinstance(data.get("operations"), list):
        return [o for o in data["operations"] if isinstance(o, dict)]
    return []


def _json_len(v: Any) -> int:
    return len(json.dumps(v, separators=(",", ":"), ensure_ascii=False).encode())


def list_clamp_999(req: Req, st: dict[str, Any]) -> Req:
    if req.method == "GET" and _is_timer_list(req.path) and "limit" in req.query:
        try:
            n = int(req.query["limit"])
        except ValueError:
            return req
        if n >= 1000:
            _set_query(req, {**req.query, "limit": "999"})
    return req


def dlq_limit_rejected(req: Req, st: dict[str, Any]) -> Req | Resp:
    if req.method == "GET" and req.path == "/api/v1/dlq" and "limit" in req.query:
        try:
            n = int(req.query["limit"])
        except ValueError:
            n = -1
        if not 1 <= n <= 1000:
            return error(400, "bad_request", "bad_limit", "limit must be between 1 and 1000")
    return req


def _lock_ops(req: Req) -> list[Any]:
    try:
        data = json.loads(req.body) if req.body else None
    except ValueError:
        return []
    if req.method == "POST" and req.path == "/api/v1/locks" and isinstance(data, dict):
        ops = data.get("operations")
        return ops if isinstance(ops, list) else []
    return []


def lock_renew_same_token(req: Req, resp: Resp, st: dict[str, Any]) -> Resp:
    """A renew that extends the permit but answers (and keeps) the token it was given."""
    data = resp.json()
    ops = _lock_ops(req)
    if not ops or not isinstance(data, dict) or not isinstance(data.get("results"), list):
        return resp
    for op, r in zip(ops, data["results"], strict=False):
        if isinstance(op, dict) and op.get("op") == "renew" and isinstance(r, dict) and r.get("renewed"):
            r["token"] = op.get("token")
            if isinstance(r.get("guard"), dict):
                r["guard"]["expect"] = op.get("token")
    resp.set_json(data)
    return resp


def lock_limit_ignored(req: Req, st: dict[str, Any]) -> Req | Resp:
    """Every semaphore is a lock: the acquire's limit is dropped."""
    ops = _lock_ops(req)
    if any(isinstance(op, dict) and "limit" in op for op in ops):
        req.body = json.dumps({"operations": [{k: v for k, v in op.items() if k != "limit"} if isinstance(op, dict)
                                              else op for op in ops]}).encode()
    return req


MUTANTS: dict[str, Mutant] = {m.name: m for m in (
    Mutant("absent-ok-true", ("TMR-ABSENT-OK-FALSE",), "absent answered with ok: true", on_response=absent_ok_true),
    Mutant("hint-dropped", ("TMR-BLOCKED-HINT",), "the x-queen-timers-hint header is dropped", on_response=hint_dropped),
    Mutant("owned-field-accepted", ("TMR-OWNED-PRODUCERSUB", "TMR-OWNED-MESSAGEID", "TMR-OWNED-TENANT",
                                    "TMR-OWNED-UNDERSCORE"),
           "server-owned fields silently dropped (stripped before forwarding) instead of refused",
           on_request=owned_fields_stripped),
    Mutant("list-limit-rejected", ("TMR-LIST-LIMIT-CLAMPED",), "the list limit rejected instead of clamped",
           on_request=list_limit_rejected),
    Mutant("eph-nack-reads-acked", ("EPH-ACK-OUTCOMES", "EPH-RETRY-LIMIT"),
           "an ephemeral nack's outcome reported as acked instead of redelivered", on_response=eph_nack_reads_acked),
    Mutant("too-late-409", ("TMR-TOO-LATE-CANCEL", "TMR-TOO-LATE-RESCHEDULE"), "too_late answered as HTTP 409",
           on_response=too_late_409),
    Mutant("retry-after-dropped", ("LIM-RATE-LIMITED", "LIM-QUOTA-EXCEEDED"), "Retry-After dropped from 429",
           on_response=retry_after_dropped),
    # (core reads an error body without a reason: ENV-MALFORMED-JSON keeps passing; the strict ones fail)
    Mutant("reason-removed", ("ENV-SHAPE", "ENV-NO-SUCH-ROUTE"),
           "the envelope's reason removed", on_response=reason_removed),
    Mutant("peek-miss-404", ("TMR-PEEK-MISS",), "a peek miss answered 404", on_response=peek_miss_404),
    Mutant("kv-expired-returned", ("KV-EXPIRED-NEVER-RETURNED",), "an expired KV key returned by get",
           on_request=kv_remember, on_response=kv_expired_returned),
    Mutant("taxonomy-extended", ("TMR-STATUS-CLOSED", "TMR-UPSERT-STATUS-BY-ROW"),
           "the status taxonomy extended (rescheduled reported as updated)", on_response=taxonomy_extended),
    Mutant("message-id-changed", ("TMR-MESSAGEID-AT-SCHEDULE",),
           "the messageId returned at schedule is not the one the frame carries at fire",
           on_response=message_id_changed),
    Mutant("deliver-at-absolute", ("TMR-RELATIVE-ONLY",), "an absolute deliverAt accepted (turned into a delay)",
           on_request=deliver_at_absolute),
    # A broker that ignores deadlineMs offers no deadlines: NOT IMPLEMENTED (conformance/features.py), which
    # fails the gate only where the profile is required.
    Mutant("deadline-ignored", ("DL-NOT-DELIVERED", "DL-TO-DLQ", "DL-BAD-DEADLINE"), "push deadlineMs ignored",
           on_request=deadline_ignored, suite_args=("--require", "deadlines")),
    Mutant("pop-deadline-restarted", ("DL-POP-DEADLINE",),
           "the deadlineAt handed out at pop is counted from the pop, not fixed at push",
           on_response=pop_deadline_restarted),
    Mutant("cancel-via-batch", ("LIM-CANCEL-EVERY-RUNG", "TMR-CANCEL-NO-GRANT", "TMR-CANCEL-PASSES-PAUSED"),
           "the DELETE cancel implemented through the batch route (schedule authorization)",
           on_request=cancel_via_batch, on_response=cancel_unwrap),
    Mutant("truncated-lies", ("TMR-LIST-TRUNCATED",), "list truncated always false", on_response=truncated_lies),
    Mutant("horizon-400", ("TMR-HORIZON-403",), "a horizon overrun answered 400", on_response=horizon_400),
    Mutant("kv-500", ("ENV-NO-500",), "bad KV input answered 500", on_response=kv_400_is_500),
    Mutant("route-code-renamed", ("ENV-NO-SUCH-ROUTE",), "unknown routes answer not_found instead of no_such_route",
           on_response=route_code_renamed),
    Mutant("txn-failed-index-local", ("TXN-KV-PRECONDITION",),
           "a lost transaction precondition reports its index inside kv, not in the flat space",
           on_request=txn_remember, on_response=failed_index_local),
    Mutant("fire-order-reversed", ("TMR-FIRE-ORDER",), "timers maturing in one cycle enter the log in reverse",
           on_response=pop_reversed),
    Mutant("fires-early", ("TMR-DELIVERAT-FLOOR",), "a timer fires before its deliverAt",
           on_response=deliver_at_promised_late),
    Mutant("cancel-fake", ("TMR-CANCEL-WITHDRAWS",), "DELETE answers cancelled but the timer still fires",
           on_request=cancel_fake),
    Mutant("tenant-ignored", ("TMR-TENANT-ISOLATION", "TMR-ABSENT-OTHER-TENANT", "KV-TENANT-ISOLATION"),
           "tenant isolation lost (every call runs as the first tenant seen)", on_request=tenant_ignored),
    Mutant("producer-sub-forged", ("TMR-PRODUCERSUB-ATTESTED",), "the frame's producerSub is not the scheduler's",
           on_response=producer_sub_rewritten),
    Mutant("kv-delete-absent-404", ("KV-DELETE-ABSENT-200",), "a delete of a missing key answered 404",
           on_response=kv_delete_absent_404),
    # ---- the message log
    Mutant("push-dedupe-lost", ("LOG-PUSH-DEDUPE", "LOG-PUSH-DEDUPE-IN-REQUEST"),
           "a repeated (partition, transactionId) answered queued with a new id", on_response=push_duplicate_queued),
    Mutant("push-results-unaligned", ("LOG-PUSH-ARRAY",), "push results in another order than the items",
           on_response=push_results_reversed),
    Mutant("push-unknown-field-dropped", ("LOG-PUSH-UNKNOWN-FIELD",), "unknown push item keys silently dropped",
           on_request=push_unknown_field_dropped),
    Mutant("pop-empty-200", ("LOG-POP-204",), "an empty pop answered 200 {messages: []} instead of 204",
           on_response=pop_empty_200),
    Mutant("pop-lifo", ("LOG-POP-FIFO",), "a pop hands a partition's messages out newest first",
           on_response=pop_reversed),
    Mutant("pop-group-ignored", ("LOG-POP-GROUPS-SEE-ALL",), "consumerGroup ignored: every pop is queue mode",
           on_request=pop_query_dropped("consumerGroup")),
    Mutant("pop-batch-ignored", ("LOG-POP-BATCH",), "batch ignored: every pop hands out the default batch",
           on_request=pop_query_dropped("batch")),
    Mutant("conflation-ignored", ("LOG-POP-CONFLATION", "LOG-POP-CONFLATION-ECHO-EMPTY", "LOG-POP-CONFLATION-STORED",
                                  "LOG-POP-CONFLATION-REFUSALS"),
           "conflation=true ignored: an ordinary pop, no echo", on_request=pop_query_dropped("conflation"),
           suite_args=("--require", "extensions")),
    Mutant("binary-body-refused", ("LOG-PUSH-BINARY", "LOG-PUSH-BINARY-FRAMES", "LOG-TX-BINARY"),
           "the binary push and transaction bodies answered 400", on_request=binary_body_refused,
           suite_args=("--require", "extensions")),
    Mutant("pop-wait-ignored", ("LOG-POP-WAIT-WOKEN", "LOG-POP-WAIT-TIMEOUT"), "wait=true answered at once",
           on_request=pop_wait_ignored),
    Mutant("ack-refusal-409", ("LOG-ACK-PER-ITEM", "LOG-ACK-WRONG-LEASE"),
           "a refused ack answered as HTTP 409 instead of a per-item success: false", on_response=ack_refusal_409),
    Mutant("ack-lease-unchecked", ("LOG-ACK-WRONG-LEASE",), "an ack under a wrong or expired lease reports success",
           on_response=ack_lease_unchecked),
    Mutant("delivery-attempt-stuck", ("LOG-ACK-FAILED-REDELIVERS", "LOG-LEASE-EXPIRY"),
           "deliveryAttempt never grows", on_response=delivery_attempt_stuck),
    Mutant("nack-completes", ("LOG-ACK-FAILED-REDELIVERS", "LOG-RETRY-LIMIT-DLQ"),
           "a nack (failed/retry) settles the message like completed", on_request=nack_completes),
    Mutant("lease-extend-fake", ("LOG-LEASE-EXTEND", "LOG-LEASE-EXTEND-GONE"),
           "extend answers success without extending anything", on_request=lease_extend_fake),
    Mutant("dlq-group-filter-ignored", ("LOG-DLQ-LIST",), "the DLQ list ignores its consumerGroup filter",
           on_request=dlq_group_filter_ignored),
    Mutant("lookup-miss-404", ("LOG-LOOKUP",), "a lookup miss answered 404 instead of {found: false}",
           on_response=lookup_miss_404),
    Mutant("retention-ignored", ("LOG-RETENTION", "LOG-COMPLETED-RETENTION"),
           "retention options accepted but never enforced", on_request=retention_ignored,
           suite_args=("--fire-timeout", "6")),
    # ---- edges, off by one
    Mutant("horizon-off-by-one", ("EDGE-TMR-HORIZON-MS",), "delayMs equal to the 90-day horizon refused (>= for >)",
           on_request=_refuse_at(lambda r, d: any(isinstance(o.get("delayMs"), int) and o["delayMs"] >= 90 * DAY_MS
                                                  for o in _timer_ops(r, d)),
                                 error(403, "timer_horizon_exceeded", "timers_horizon", "beyond the horizon"))),
    Mutant("log-payload-off-by-one", ("EDGE-LOG-PAYLOAD-BYTES",), "a payload of exactly 1 MiB of JSON refused",
           on_request=_refuse_at(lambda r, d: any(_json_len(i.get("payload")) >= 1024 * 1024 for i in _push_items(r, d)),
                                 error(413, "payload_too_large", "payload_too_large", "payload too large"))),
    Mutant("queue-name-255", ("EDGE-LOG-NAME-LENGTH",), "a 256-character queue name refused on push",
           on_request=_refuse_at(lambda r, d: any(len(str(i.get("queue"))) >= 256 for i in _push_items(r, d)),
                                 error(400, "bad_request", "bad_name", "queue name too long"))),
    Mutant("kv-ops-255", ("EDGE-KV-OPS",), "a KV call of exactly 256 ops refused",
           on_request=_refuse_at(lambda r, d: len(_kv_ops(r, d)) >= 256,
                                 error(400, "kv_bad_request", "kv_too_many_ops", "too many ops"))),
    Mutant("kv-ttl-off-by-one", ("EDGE-KV-TTL",), "ttlSeconds of exactly 100 years refused",
           on_request=_refuse_at(lambda r, d: any(isinstance(o.get("ttlSeconds"), int) and o["ttlSeconds"] >= 100 * 365 * 86_400
                                                  for o in _kv_ops(r, d)),
                                 error(400, "kv_bad_request", "kv_bad_ttl", "ttl out of range"))),
    Mutant("deadline-off-by-one", ("EDGE-DEADLINE-MS",), "deadlineMs of exactly 7 days refused",
           on_request=_refuse_at(lambda r, d: any(isinstance(i.get("deadlineMs"), int) and i["deadlineMs"] >= 7 * DAY_MS
                                                  for i in _push_items(r, d)),
                                 error(400, "bad_request", "bad_deadline", "deadline out of range"))),
    Mutant("list-clamp-999", ("EDGE-TMR-LIST-CLAMP",), "the timer list limit clamped to 999", on_request=list_clamp_999),
    Mutant("dlq-limit-rejected", ("EDGE-DLQ-LIMIT-CLAMP",), "the DLQ list limit rejected instead of clamped",
           on_request=dlq_limit_rejected),
    Mutant("lock-renew-same-token", ("LCK-RENEW-NEW-TOKEN", "LCK-TOKEN-RISES"),
           "a lock renew keeps the token it was given instead of issuing a new one",
           on_response=lock_renew_same_token),
    Mutant("lock-limit-ignored", ("LCK-SEMAPHORE", "LCK-CONCURRENT"), "a semaphore's limit ignored: every one is a lock",
           on_request=lock_limit_ignored),
    # ---- a deployment
    Mutant("lease-per-broker", ("XB-LEASE-SHARED",),
           "one broker of the deployment keeps leases to itself (its consumer groups are not the others')",
           on_request=group_namespaced_per_broker, second_only=True),
)}


# ------------------------------------------------------------------------------------------ the proxy

SESSION: web.AppKey[aiohttp.ClientSession] = web.AppKey("session", aiohttp.ClientSession)


def build_app(target: str, mutant: Mutant) -> web.Application:
    target = target.rstrip("/")
    lock = asyncio.Lock()  # one call at a time: per-call state (kv_remember, cancel_via_batch) stays paired

    async def on_startup(app: web.Application) -> None:
        app[SESSION] = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120), auto_decompress=True)

    async def on_cleanup(app: web.Application) -> None:
        await app[SESSION].close()

    async def handle(request: web.Request) -> web.StreamResponse:
        raw = request.raw_path
        path, _, raw_query = raw.partition("?")
        req = Req(request.method, path, dict(request.query), raw_query,
                  {k: v for k, v in request.headers.items() if k.lower() not in HOP}, await request.read())
        async with lock:
            if mutant.on_request is not None:
                got = mutant.on_request(req, mutant.state)
                if isinstance(got, Resp):
                    return _render(got)
                req = got
            url = URL(target + req.path + (f"?{req.raw_query}" if req.raw_query else ""), encoded=True)
            async with request.app[SESSION].request(req.method, url, headers=req.headers, data=req.body or None) as up:
                resp = Resp(up.status, {k: v for k, v in up.headers.items() if k.lower() not in HOP}, await up.read())
            if mutant.on_response is not None:
                resp = mutant.on_response(req, resp, mutant.state)
        return _render(resp)

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.on_startup.append(on_startup)
    app.on_cleanup.append(on_cleanup)
    app.router.add_route("*", "/{tail:.*}", handle)
    return app


def _render(resp: Resp) -> web.Response:
    headers = {k: v for k, v in resp.headers.items() if k.lower() not in HOP}
    return web.Response(status=resp.status, body=resp.body if resp.status not in (204, 304) else None, headers=headers)


class MutantProxy:
    """Run the proxy in a background thread: ``with MutantProxy(url, "absent-ok-true") as proxy_url: ...``."""

    def __init__(self, target: str, mutant: str | Mutant, host: str = "127.0.0.1", port: int = 0) -> None:
        self.mutant = MUTANTS[mutant] if isinstance(mutant, str) else mutant
        self.mutant.state.clear()
        self.target, self.host, self.port = target, host, port
        self.url = ""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None

    def start(self) -> str:
        ready = threading.Event()

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            self._runner = web.AppRunner(build_app(self.target, self.mutant), access_log=None)
            loop.run_until_complete(self._runner.setup())
            site = web.TCPSite(self._runner, self.host, self.port)
            loop.run_until_complete(site.start())
            sock = site._server.sockets[0]  # type: ignore[union-attr]
            self.url = f"http://{self.host}:{sock.getsockname()[1]}"
            ready.set()
            loop.run_forever()
            loop.run_until_complete(self._runner.cleanup())
            loop.close()

        self._thread = threading.Thread(target=run, name=f"mutant-{self.mutant.name}", daemon=True)
        self._thread.start()
        if not ready.wait(10):
            raise RuntimeError("mutant proxy did not start")
        return self.url

    def stop(self) -> None:
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(10)

    def __enter__(self) -> str:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m conformance.mutants", description=__doc__.split("\n\n")[0])
    p.add_argument("--target", help="URL of the real broker")
    p.add_argument("--mutant", choices=sorted(MUTANTS))
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=7000)
    p.add_argument("--list", action="store_true")
    args = p.parse_args(argv)
    if args.list or not (args.target and args.mutant):
        for m in MUTANTS.values():
            print(f"{m.name:<22} breaks {', '.join(m.breaks)}: {m.bug}")
        return 0 if args.list else 2
    print(f"mutant {args.mutant} proxying http://{args.host}:{args.port} -> {args.target}")
    web.run_app(build_app(args.target, MUTANTS[args.mutant]), host=args.host, port=args.port, print=None)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
