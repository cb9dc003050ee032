"""HTTP helpers of the conformance suite: the only way the suite talks to a broker.

Nothing here imports the broker: the target may be anyone's broker speaking the Queen wire.
Every answer passes one check on the way in: a 5xx other than 503 fails the test on the spot (no
500 for anything a client can send).
"""

from __future__ import annotations

import base64
import json
import time
import uuid
from typing import Any
from urllib.parse import quote

import httpx


class NotVerified(Exception):
    """Raised by ``not_verified(reason)``: the contract could not be checked against this target."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def not_verified(reason: str) -> None:
    raise NotVerified(reason)


class NotImplementedFeature(Exception):
    """The target does not offer a feature the contract needs (conformance/features.py decided it)."""

    def __init__(self, feature: str, evidence: str) -> None:
        super().__init__(f"{feature}: {evidence}")
        self.feature = feature
        self.evidence = evidence


# A pop that expects messages waits up to this long for them (a long poll, answered at once when they are
# there): the protocol promises a waiting pop the message as soon as it is visible (docs/protocol.md §2.4),
# not that a non-waiting pop sees a push the moment it was acknowledged (some brokers publish new
# partitions to their pop path asynchronously).
SETTLE_MS = 1000

# Any 2xx is a success on the wire (docs/protocol.md §1.4): the core contracts accept the whole range.
OK = range(200, 300)


def setup(resp: httpx.Response, what: str, status: int | tuple[int, ...] | range = OK) -> Any:
    """A setup step (a push, a configure ... that the contract is not about): its answer never decides the
    verdict. A refusal makes the contract NOT VERIFIED with the reason, not FAILED; the contract about that
    step judges it."""
    wanted = (status,) if isinstance(status, int) else status
    if resp.status_code not in wanted:
        not_verified(f"setup step failed ({what}): {resp.request.method} {resp.request.url.path} answered "
                     f"{resp.status_code}: {resp.text[:200]}")
    return body(resp)


def pushed(resp: httpx.Response) -> Any:
    """A push that is a setup step (any 2xx, a JSON array of results, none of them failed)."""
    data = setup(resp, "push")
    if not isinstance(data, list) or any(isinstance(r, dict) and r.get("status") == "failed" for r in data):
        not_verified(f"setup step failed (push): the push answered {str(data)[:200]}")
    return data


def configured(resp: httpx.Response) -> Any:
    """A configure that is a setup step (any 2xx)."""
    return setup(resp, "configure")


TIMERS = "/api/v1/timers"
STATUSES = frozenset({"scheduled", "rescheduled", "cancelled", "absent", "too_late"})


def uniq(prefix: str = "c") -> str:
    return f"cf-{prefix}-{uuid.uuid4().hex[:12]}"


def b64(obj: Any) -> str:
    """A JSON payload as the client sends it: JSON text, base64."""
    return base64.b64encode(json.dumps(obj).encode()).decode()


def parse_ts(text: str) -> float:
    """ISO-8601 UTC (``...Z``) to epoch seconds, microsecond precision kept."""
    from datetime import datetime

    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


class Target:
    def __init__(self, url: str, fire_timeout: float = 20.0, lag_budget_ms: float = 1000.0) -> None:
        self.url = url
        self.fire_timeout = fire_timeout
        self.lag_budget_ms = lag_budget_ms
        self._clients: list[httpx.Client] = []

    def api(self, token: str | None, *, label: str, tenant: str | None = None, sub: str | None = None) -> Api:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        client = httpx.Client(base_url=self.url, headers=headers, timeout=30.0,
                              event_hooks={"response": [_no_500]})
        self._clients.append(client)
        return Api(client, self, token=token, label=label, tenant=tenant, sub=sub)

    def raw(self) -> httpx.Client:
        """A client with no credential and no 5xx check (the envelope tests inspect everything)."""
        client = httpx.Client(base_url=self.url, timeout=30.0)
        self._clients.append(client)
        return client

    def close(self) -> None:
        for c in self._clients:
            c.close()


def _no_500(resp: httpx.Response) -> None:
    if resp.status_code >= 500 and resp.status_code != 503:
        resp.read()
        raise AssertionError(
            f"{resp.request.method} {resp.request.url.path} answered {resp.status_code}: {resp.text[:300]}"
        )


def empty_pop(resp: httpx.Response) -> bool:
    """An empty pop as the protocol allows it (docs/protocol.md §2.4): 204, or 200 with no messages."""
    if resp.status_code == 204:
        return True
    data = body(resp) if resp.status_code == 200 else None
    return isinstance(data, dict) and not [m for m in (data.get("messages") or []) if m]


def body(resp: httpx.Response) -> Any:
    try:
        return resp.json()
    except ValueError:
        return None


def expect(resp: httpx.Response, status: int | tuple[int, ...] | range) -> Any:
    wanted = (status,) if isinstance(status, int) else status
    assert resp.status_code in wanted, (
        f"{resp.request.method} {resp.request.url.path}: expected HTTP {wanted}, got {resp.status_code}: {resp.text[:400]}"
    )
    return body(resp)


def expect_error(resp: httpx.Response, status: int | tuple[int, ...], code: str | None = None,
                 reason: str | None = None) -> dict[str, Any]:
    """A refusal: the status, an error body the client reads (``error``, optional ``reason``/``code``:
    docs/protocol.md §1.7) and (optionally) the code/reason. The full envelope of this broker (``reason``
    and ``detail`` always there) is the strict contract ENV-SHAPE (``assert_envelope``)."""
    data = expect(resp, status)
    assert_error_body(resp, data)
    if code is not None:
        got = data.get("code") if isinstance(data.get("code"), str) else data["error"]
        assert code in (data["error"], got), f"expected error code {code!r}, got {data!r}"
    if reason is not None:
        assert data.get("reason") == reason, f"expected reason {reason!r}, got {data!r}"
    return data


def assert_error_body(resp: httpx.Response, data: Any = None) -> None:
    """What the client reads of a refusal (docs/protocol.md §1.4, §1.7): a JSON object with a string
    ``error``; ``reason``, ``code`` and ``detail`` are strings when present."""
    data = body(resp) if data is None else data
    where = f"{resp.request.method} {resp.request.url.path} -> {resp.status_code}"
    assert "json" in resp.headers.get("content-type", ""), f"{where}: error without a JSON content type"
    assert isinstance(data, dict), f"{where}: error body is not a JSON object: {resp.text[:200]}"
    assert isinstance(data.get("error"), str) and data["error"], f"{where}: error body lacks a string 'error': {data!r}"
    for k in ("reason", "code", "detail"):
        assert data.get(k) is None or isinstance(data[k], str), f"{where}: {k!r} is not a string: {data!r}"


def assert_envelope(resp: httpx.Response, data: Any = None) -> None:
    """This broker's envelope, exactly: {error, reason, detail}, all non-empty strings (strict)."""
    data = body(resp) if data is None else data
    assert_error_body(resp, data)
    where = f"{resp.request.method} {resp.request.url.path} -> {resp.status_code}"
    for k in ("error", "reason", "detail"):
        assert isinstance(data.get(k), str) and data[k], f"{where}: envelope lacks a string {k!r}: {data!r}"


class Api:
    """One tenant's view of the target."""

    def __init__(self, client: httpx.Client, target: Target, *, token: str | None, label: str,
                 tenant: str | None, sub: str | None) -> None:
        self.http = client
        self.target = target
        self.token = token
        self.label = label
        self.tenant = tenant
        self.sub = sub

    # ----------------------------------------------------------------- ephemeral queues (§6)
    def eph_configure(self, queue: str, **options: Any) -> httpx.Response:
        return self.http.post("/api/v1/ephemeral/configure", json={"queue": queue, "options": options})

    def eph_push(self, queue: str, payloads: list[Any], partition: str | None = None) -> httpx.Response:
        body: dict[str, Any] = {"queue": queue, "messages": [{"payload": p} for p in payloads]}
        if partition is not None:
            body["partition"] = partition
        return self.http.post("/api/v1/ephemeral/push", json=body)

    def eph_pop(self, queue: str, timeout_s: float = 30, **params: Any) -> list[dict[str, Any]]:
        """The messages of one pop (asserting the 200 answer's shape)."""
        data = expect(self.http.get("/api/v1/ephemeral/pop", params={"queue": queue, **params}, timeout=timeout_s), 200)
        assert isinstance(data, dict) and data.get("queue") == queue and isinstance(data.get("messages"), list), data
        return data["messages"]

    def eph_ack(self, queue: str, acks: list[dict[str, Any]], group: str | None = None) -> list[str]:
        """The outcomes of one ack call, in order (asserting one result per id)."""
        body: dict[str, Any] = {"queue": queue, "acks": acks, **({"group": group} if group else {})}
        data = expect(self.http.post("/api/v1/ephemeral/ack", json=body), 200)
        results = data["results"]
        assert [r["id"] for r in results] == [a["id"] for a in acks], data
        return [r["outcome"] for r in results]

    def eph_depth(self, queue: str) -> httpx.Response:
        return self.http.get(f"/api/v1/ephemeral/queues/{quote(queue, safe='')}/depth")

    # ----------------------------------------------------------------- timers
    def timers(self, ops: list[dict[str, Any]], **kw: Any) -> httpx.Response:
        return self.http.post(TIMERS, json={"operations": ops}, **kw)

    def schedule_op(self, queue: str, key: str, *, delay_ms: int = 0, payload: Any = None, txn: str | None = None,
                    op: str = "schedule", **extra: Any) -> dict[str, Any]:
        o: dict[str, Any] = {"op": op, "queue": queue, "timerKey": key, "delayMs": delay_ms,
                             "txn": txn or uuid.uuid4().hex, "payload": b64(payload if payload is not None else {"k": key})}
        o.update(extra)
        return o

    def schedule(self, queue: str, key: str, **kw: Any) -> dict[str, Any]:
        resp = self.timers([self.schedule_op(queue, key, **kw)])
        data = expect(resp, 200)
        assert isinstance(data, dict) and isinstance(data.get("results"), list) and len(data["results"]) == 1, data
        return data["results"][0]

    def cancel(self, queue: str, key: str, txn: str | None = None) -> httpx.Response:
        params = {"txn": txn} if txn is not None else None
        return self.http.delete(f"{TIMERS}/{quote(queue, safe='')}/{quote(key, safe='/')}", params=params)

    def peek(self, queue: str, key: str) -> httpx.Response:
        return self.http.get(f"{TIMERS}/{quote(queue, safe='')}/{quote(key, safe='/')}")

    def peek_ok(self, queue: str, key: str) -> dict[str, Any]:
        data = expect(self.peek(queue, key), 200)
        assert isinstance(data, dict) and "found" in data, data
        return data

    def list(self, queue: str, **params: Any) -> httpx.Response:
        return self.http.get(f"{TIMERS}/{quote(queue, safe='')}", params=params or None)

    # ----------------------------------------------------------------- log
    def push(self, queue: str, payloads: list[Any], *, partition: str = "Default", **extra: Any) -> httpx.Response:
        items = []
        for p in payloads:
            item = {"queue": queue, "partition": partition, "payload": p, "transactionId": uuid.uuid4().hex}
            item.update(extra)
            items.append(item)
        return self.http.post("/api/v1/push", json={"items": items})

    def configure(self, queue: str, **options: Any) -> httpx.Response:
        return self.http.post("/api/v1/configure", json={"queue": queue, "namespace": None, "task": None, "options": options})

    def pop(self, queue: str, *, wait_ms: int = SETTLE_MS, batch: int = 100) -> list[dict[str, Any]]:
        """One auto-acked pop, waiting up to ``wait_ms`` for a message (0: not at all)."""
        params = {"batch": str(batch), "wait": "true" if wait_ms else "false", "timeout": str(wait_ms or 1),
                  "autoAck": "true"}
        resp = self.http.get(f"/api/v1/pop/queue/{quote(queue, safe='')}", params=params,
                             timeout=30.0 + wait_ms / 1000)
        if resp.status_code == 204:
            return []
        data = expect(resp, 200)
        assert isinstance(data, dict), data
        return [m for m in (data.get("messages") or []) if m]

    def drain(self, queue: str, settle_ms: int = 0) -> list[dict[str, Any]]:
        """Every message currently deliverable in the queue (auto-acked)."""
        out: list[dict[str, Any]] = []
        if settle_ms:
            time.sleep(settle_ms / 1000)
        wait = SETTLE_MS  # the first pop waits for what was just pushed; the next ones take what is left
        while True:
            got = self.pop(queue, wait_ms=wait)
            if not got:
                return out
            out.extend(got)
            wait = 0

    def offers(self, feature: str) -> bool:
        """Does the target offer this optional feature (catalogue.FEATURES)? The run's probe decides."""
        from conformance.features import probe

        raw = httpx.Client(base_url=self.target.url, timeout=30.0,
                           headers={k: v for k, v in self.http.headers.items() if k.lower() == "authorization"})
        self.target._clients.append(raw)
        return not probe(feature, raw).missing

    def stored(self, queue: str, txn: str) -> bool:
        """Is the message with this transaction id in the queue? By the lookup route where the broker has one
        (an extension), else by what a brand-new consumer group reads from the oldest message on, which
        every broker serves (docs/protocol.md §2.4: a new group starts at the oldest message)."""
        if self.offers("lookup"):
            return bool(self.lookup(queue, txn)["found"])
        group = uniq("stored")
        seen: set[str] = set()
        for _ in range(1000):
            resp = self.pop_raw(queue, consumerGroup=group, subscriptionMode="all", autoAck=True, wait=False,
                                batch=1000)
            if empty_pop(resp):
                return txn in seen
            data = expect(resp, 200)
            seen.update(str(m.get("transactionId")) for m in data.get("messages") or [] if m)
        raise AssertionError(f"queue {queue} still handing out messages to a new group after 1000 pops")

    def lookup(self, queue: str, txn: str) -> dict[str, Any]:
        data = expect(self.http.get("/api/v1/messages/lookup", params={"queue": queue, "txn": txn}), 200)
        assert isinstance(data, dict) and "found" in data, data
        return data

    def wait_delivered(self, queue: str, txn: str, timeout: float | None = None) -> dict[str, Any]:
        deadline = time.monotonic() + (timeout if timeout is not None else self.target.fire_timeout)
        while True:
            found = self.lookup(queue, txn)
            if found["found"]:
                return found
            if time.monotonic() > deadline:
                raise AssertionError(f"txn {txn} never reached queue {queue} within the deadline")
            time.sleep(0.03)

    def dlq(self, queue: str) -> list[dict[str, Any]]:
        data = expect(self.http.get("/api/v1/dlq", params={"queue": queue, "limit": "100"}), 200)
        assert isinstance(data, dict) and isinstance(data.get("messages"), list), data
        return data["messages"]

    def push_items(self, items: list[dict[str, Any]]) -> httpx.Response:
        return self.http.post("/api/v1/push", json={"items": items})

    def pop_raw(self, queue: str, *, partition: str | None = None, timeout_s: float = 30.0,
                **params: Any) -> httpx.Response:
        """A pop with exactly the query parameters given (values sent as strings; True -> 'true')."""
        path = f"/api/v1/pop/queue/{quote(queue, safe='')}"
        if partition is not None:
            path += f"/partition/{quote(partition, safe='')}"
        q = {k: ("true" if v is True else "false" if v is False else str(v)) for k, v in params.items()}
        return self.http.get(path, params=q, timeout=timeout_s)

    def pop_leased(self, queue: str, *, group: str | None = None, batch: int = 100, **params: Any) -> dict[str, Any] | None:
        """A pop under a lease (waiting up to SETTLE_MS): the answer, or None when empty (204 or 200 with no
        messages)."""
        if group is not None:
            params["consumerGroup"] = group
        params.setdefault("wait", True)  # a long poll of SETTLE_MS: see SETTLE_MS
        params.setdefault("timeout", SETTLE_MS)
        resp = self.pop_raw(queue, batch=batch, timeout_s=30 + SETTLE_MS / 1000, **params)
        if resp.status_code == 204:
            return None
        if empty_pop(resp) and params.get("conflation") is None:
            return None  # 200 with no messages: the same "nothing" (conflating pops keep their echo)
        data = expect(resp, 200)
        assert isinstance(data, dict) and isinstance(data.get("messages"), list), data
        return data

    def ack(self, msg: dict[str, Any], *, status: str = "completed", lease: str | None = "", group: str | None = None,
            error: str | None = None) -> dict[str, Any]:
        """Ack one popped message (its own lease unless ``lease`` is given; None = no leaseId); the element."""
        body: dict[str, Any] = {"transactionId": msg["transactionId"], "partitionId": msg["partitionId"],
                                "status": status, "error": error}
        lease_id = msg.get("leaseId") if lease == "" else lease
        if lease_id:
            body["leaseId"] = lease_id
        if group is not None:
            body["consumerGroup"] = group
        data = expect(self.http.post("/api/v1/ack", json=body), 200)
        assert isinstance(data, list) and len(data) == 1 and isinstance(data[0], dict), data
        return data[0]

    # ----------------------------------------------------------------- kv, usage
    def kv(self, ops: list[dict[str, Any]]) -> httpx.Response:
        return self.http.post("/api/v1/kv", json={"operations": ops})

    def kv_ok(self, ops: list[dict[str, Any]]) -> list[dict[str, Any]]:
        data = expect(self.kv(ops), 200)
        assert isinstance(data, dict) and isinstance(data.get("results"), list), data
        assert len(data["results"]) == len(ops), f"results not index-aligned: {data}"
        return data["results"]

    # ----------------------------------------------------------------- locks
    def locks(self, ops: list[dict[str, Any]]) -> httpx.Response:
        return self.http.post("/api/v1/locks", json={"operations": ops})

    def locks_ok(self, ops: list[dict[str, Any]]) -> list[dict[str, Any]]:
        resp = self.locks(ops)
        if resp.status_code == 404:
            not_verified("the target has no POST /api/v1/locks")
        data = expect(resp, 200)
        assert isinstance(data, dict) and isinstance(data.get("results"), list), data
        assert len(data["results"]) == len(ops), f"not one result per op: {data}"
        return data["results"]

    def lock(self, op: dict[str, Any]) -> dict[str, Any]:
        return self.locks_ok([op])[0]

    def usage(self) -> dict[str, Any]:
        resp = self.http.get("/api/v1/usage")
        if resp.status_code == 404:
            not_verified("the target has no GET /api/v1/usage")
        data = expect(resp, 200)
        assert isinstance(data, dict), data
        return data


def usage_messages(u: dict[str, Any]) -> int:
    """The messages counter of a /api/v1/usage answer (current period)."""
    for path in (("messages",), ("usage", "messages"), ("period", "messages"), ("current", "messages")):
        node: Any = u
        for p in path:
            node = node.get(p) if isinstance(node, dict) else None
        if isinstance(node, int):
            return node
    raise AssertionError(f"no messages counter in /api/v1/usage answer: {u!r}")


def poll(fn: Any, *, timeout: float, interval: float = 0.03, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        got = fn()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached within {timeout:.1f}s (last: {got!r})")
        time.sleep(interval)


class Admin:
    """The operator surface. Missing or refused routes make the contract NOT VERIFIED."""

    def __init__(self, api: Api) -> None:
        self.api = api

    def _call(self, method: str, path: str, json_body: Any = None, *, probing: bool = False) -> Any:
        """An operator call. A route the target does not have (404/405) makes the contract NOT VERIFIED;
        so does a refused credential at the probe. Once the probe passed, a refusal is a failure."""
        resp = self.api.http.request(method, path, json=json_body)
        if resp.status_code in (404, 405) or (probing and resp.status_code in (401, 403)):
            not_verified(f"the target's admin API is not usable: {method} {path} answered {resp.status_code} {resp.text[:160]}")
        return expect(resp, (200, 201, 204))

    def probe(self) -> None:
        self._call("GET", "/api/v1/admin/timers/sweeper", probing=True)

    def sweeper_paused(self, paused: bool) -> Any:
        return self._call("POST", "/api/v1/admin/timers/sweeper", {"paused": paused})

    def scheduling(self, enabled: bool) -> Any:
        return self._call("POST", "/api/v1/admin/timers/scheduling", {"enabled": enabled})

    def timers_paused(self, tenant: str, paused: bool) -> Any:
        return self._call("POST", f"/api/v1/admin/tenants/{quote(tenant, safe='')}/timers-paused", {"paused": paused})

    def cluster_suspended(self, suspended: bool) -> Any:
        return self._call("POST", "/api/v1/admin/cluster/suspended", {"suspended": suspended})

    def set_plan(self, tenant: str, **fields: Any) -> Any:
        return self._call("PUT", f"/api/v1/admin/tenants/{quote(tenant, safe='')}/plan", fields)

    def clear_plan(self, tenant: str) -> Any:
        return self._call("DELETE", f"/api/v1/admin/tenants/{quote(tenant, safe='')}/plan")


class Hooks:
    """The fault-injection hooks (QUEEN_TEST_HOOKS=1). Absent or disabled -> NOT VERIFIED."""

    def __init__(self, api: Api) -> None:
        self.api = api

    def _post(self, path: str, json_body: Any, *, probing: bool = False) -> Any:
        resp = self.api.http.post(path, json=json_body)
        if resp.status_code in (404, 405) or (probing and resp.status_code in (401, 403)):
            not_verified(f"the target does not offer the fault-injection hooks: POST {path} answered "
                         f"{resp.status_code} {resp.text[:160]}")
        return expect(resp, (200, 201, 204))

    def probe(self) -> None:
        self._post("/api/v1/test/timers/release", {}, probing=True)

    def fail(self, queue: str, count: int, klass: str) -> Any:
        return self._post("/api/v1/test/timers/fail", {"queue": queue, "count": count, "class": klass})

    def hold(self, queue: str, key: str, ms: int) -> Any:
        return self._post("/api/v1/test/timers/hold", {"queue": queue, "timerKey": key, "ms": ms})

    def release(self, queue: str | None = None) -> Any:
        return self._post("/api/v1/test/timers/release", {"queue": queue} if queue else {})

    def dead_letter_timer(self, queue: str, key: str, txn: str) -> list[dict[str, Any]]:
        """Schedule a timer whose every fire fails permanently; return its queue's DLQ rows for it."""
        api = self.api
        self.fail(queue, 10_000, "permanent")
        try:
            api.schedule(queue, key, delay_ms=0, txn=txn)
            rows: list[dict[str, Any]] = poll(
                lambda: [m for m in api.dlq(queue) if m.get("transactionId") == txn],
                timeout=api.target.fire_timeout * 2, what="the timer in its queue's DLQ")
        finally:
            self.release(queue)
        return rows
