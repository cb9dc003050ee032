"""What the tests say to the broker, written once.

- ``Api(http)``: the broker's HTTP routes over an ``httpx.Client``. The raw ones (``push_items``,
  ``push_n``, ``pop_response``, ``transaction``, ``timers``, ``cancel``, ``peek``, ``list_timers``,
  ``kv``, ``locks``) return the ``httpx.Response`` untouched, so a test asserts what it means to
  (``api.timers(op).status_code``); the others (``configure``, ``push``, ``push_each``, ``pop``,
  ``messages``, ``pop_until``, ``delivered``, ``ack``, ``ack_all``, ``lookup``, ``found``, ``tx``,
  ``timer_results``, ``wait_fired``, ``kv_body``, ``kv_results``, ``kv_one``, ``lock_results``,
  ``lock_one``) first assert the status every caller expects and return the body. Anything else goes
  to the ``httpx.Client``.
- ``authed(secret, broker, tenant, sub, grants)``: an ``Api`` whose client carries an HS256 token.
- ``dedicated_broker(...)``: a module's own ``queen serve`` with its settings, as a context manager.
- ``timer_op(...)``, ``push_op(...)``, ``ack_op(...)``, ``kv_put(...)``, ``acquire_op(...)``: request fragments.
- ``refused(r, status, code, reason)``: assert an error envelope.
- ``wait_for(pred)``: poll until something truthy comes back (sync); ``await_delivered(client, ...)``:
  the same for a ``queen-mq`` client waiting on a timer's message.
- ``db_fetch(dsn, sql, *args)``: one query on a database, from sync test code; ``frames(dsn, txn)``.
- ``take_and_lease(conn, ...)``: the sweeper's cycle for rows it holds outside a transaction (take, lease,
  commit), from a test's own connection.
- ``sql_push``, ``sql_pop``, ``sql_ack``: the log's SQL functions (queen_push / queen_pop / queen_ack)
  called directly, for tests that judge the log below HTTP; ``sql_apply``: queen_timers_apply.
- ``apply_call``, ``take_call``, ``sweep_call``, ``fire_call``: the timers' typed call objects
  (``broker.timers.calls``) as the tests build them: ``conn.fetch(Q.timers_take, *take_call().args())``.
"""

from __future__ import annotations

import asyncio
import base64
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import asyncpg
import httpx
from conftest import run_sync

from broker.auth import mint
from broker.log.calls import Ack, Pop, Push
from broker.process.localserver import LocalBroker
from broker.store.queries import Q
from broker.timers.calls import Retry, TimersApply, TimersFire, TimersLease, TimersSweep, TimersTake

T = TypeVar("T")


# ------------------------------------------------------------------------------------------- waiting


def wait_for(pred: Callable[[], T], timeout: float = 10.0, what: str = "condition", interval: float = 0.05) -> T:
    """Call ``pred`` until it returns something truthy and return that; fail the test after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"{what}: not met within {timeout}s")
        time.sleep(interval)


async def await_delivered(client: Any, queue: str, txn: str, timeout: float = 10.0, interval: float = 0.05,
                          what: str | None = None) -> None:
    """Wait until the message with ``txn`` is in ``queue``, asked through a ``queen-mq`` client's HTTP
    client (the client has no lookup API of its own; the broker's lookup route answers)."""
    http = client._http_client
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while loop.time() < deadline:
        body = await http.get(f"/api/v1/messages/lookup?queue={queue}&txn={txn}")
        if body and body.get("found"):
            return
        await asyncio.sleep(interval)
    raise AssertionError(what or f"{txn} not delivered")


# ------------------------------------------------------------------------------------------ database


def db_fetch(dsn: str, sql: str, *args: Any) -> list[asyncpg.Record]:
    """Run one query on ``dsn`` and return its rows (from sync code, even inside a running loop)."""

    async def go() -> list[asyncpg.Record]:
        conn = await asyncpg.connect(dsn)
        try:
            return await conn.fetch(sql, *args)
        finally:
            await conn.close()

    return run_sync(go())


def frames(dsn: str, txn: str) -> list[asyncpg.Record]:
    """The log rows (id, created_at) carrying transaction id ``txn``: how many times a timer fired."""
    return db_fetch(dsn, "SELECT id, created_at FROM queen_messages WHERE txn = $1", txn)


# ------------------------------------------------------------------------- the timers' SQL calls

RETRY = Retry(max_attempts=3, backoff_base_ms=50, backoff_cap_ms=1000)


def apply_call(tenant: str, ops: Sequence[tuple[str, str, str]], *, sub: str = "sub", check_switch: bool = True,
               txns: Sequence[str] | None = None, partition: str | None = None,
               payloads: Sequence[bytes] | None = None, delays_ms: Sequence[int] | None = None,
               delay_ms: int = 3_600_000, ready: bool = True) -> TimersApply:
    """``queen_timers_apply`` of ``(op, queue, key)`` triples (query ``timers_apply``). A schedule (or
    reschedule) gets a fresh message id, its payload (``b'{"x":1}'`` unless ``payloads``), its delay
    (``delays_ms``, else ``delay_ms``) and ``ready``; a cancel only its key. Txns are ``t-<key>`` unless
    given; no partition means the default one."""
    n = len(ops)
    sched = [op != "cancel" for op, _, _ in ops]
    body = list(payloads) if payloads is not None else [b'{"x":1}'] * n
    delays = list(delays_ms) if delays_ms is not None else [delay_ms] * n
    return TimersApply(
        tenant=tenant, sub=sub, check_switch=check_switch, near_ms=1000, ops=[op for op, _, _ in ops],
        queues=[q for _, q, _ in ops], keys=[k for _, _, k in ops],
        partitions=[partition] * n if partition is not None else None,
        txns=list(txns) if txns is not None else [f"t-{k}" for _, _, k in ops],
        ids=[uuid.uuid4() if s else None for s in sched], payloads=[b if s else None for b, s in zip(body, sched, strict=True)],
        zstd=None, key_ids=None, delays_ms=[d if s else None for d, s in zip(delays, sched, strict=True)],
        ready=[ready if s else None for s in sched],
    )


def take_call(batch: int = 100) -> TimersTake:
    """The sweeper's take (query ``timers_take``): ``batch`` rows, the walk from the first tenant, no faults."""
    return TimersTake(batch=batch, cursor=None, faults=False, slice_cap=250)


def sweep_call(batch: int = 1000, *, retry: Retry = RETRY, in_tx: bool = True) -> TimersSweep:
    """The sweeper's cycle statement (query ``timers_sweep``), inside the caller's transaction unless told."""
    return TimersSweep(take=take_call(batch), retry=retry, in_tx=in_tx)


def fire_call(rows: Sequence[Any], *, token: uuid.UUID | None = None, retry: Retry = RETRY) -> TimersFire:
    """The fire (query ``timers_fire``) of ``rows`` with their stored bytes, none failed: rows taken in the
    caller's transaction (records of a take: tenant, queue, timer_key, message_id, tid), or with
    ``token`` the rows leased under it (only tenant, queue and timer_key are read)."""
    n = len(rows)
    taken = token is None
    return TimersFire(
        token=token, g_tenants=[r["tenant"] for r in rows], g_queues=[r["queue"] for r in rows],
        g_keys=[r["timer_key"] for r in rows], g_ids=[r["message_id"] for r in rows] if taken else None,
        g_tids=[r["tid"] for r in rows] if taken else None, g_payloads=[None] * n, g_codecs=[0] * n,
        f_tenants=[], f_queues=[], f_keys=[], f_ids=[] if taken else None, f_errors=[], f_costs=[], f_wrap=[],
        retry=retry,
    )


async def take_and_lease(conn: asyncpg.Connection, *, token: uuid.UUID | None = None, lease_ms: int = 60_000,
                         batch: int = 100, claimed_by: str = "test") -> list[asyncpg.Record]:
    """What the sweeper does with rows it must hold while nothing happens (an injected stall): take them
    (``queen_timers_take``, partition-exclusive, writing nothing) and lease them (``queen_timers_lease``:
    token, ``claimed_until`` from the clock at the stamp) in one transaction (a savepoint inside the
    caller's). Returns the rows taken AND leased, in the take's order (a row a concurrent cancel or
    reschedule changed between the two is left out); the take's trailing next-due row is dropped."""
    async with conn.transaction():
        taken = [r for r in await conn.fetch(Q.timers_take, *take_call(batch).args()) if r["tenant"] is not None]
        lease = TimersLease(token=token or uuid.uuid4(), lease_ms=lease_ms, claimed_by=claimed_by,
                            tenants=[r["tenant"] for r in taken], queues=[r["queue"] for r in taken],
                            keys=[r["timer_key"] for r in taken], ids=[r["message_id"] for r in taken])
        leased = await conn.fetch(Q.timers_lease, *lease.args())
    held = {(r["tenant"], r["queue"], r["timer_key"]) for r in leased}
    return [r for r in taken if (r["tenant"], r["queue"], r["timer_key"]) in held]


QUEUE_MODE = "__QUEUE_MODE__"


async def sql_push(conn: asyncpg.Connection, tenant: str, queue: str, txns: Sequence[str], partition: str = "p",
                   payload: bytes = b'{"x":1}', deadlines_ms: Sequence[int | None] | None = None) -> list[asyncpg.Record]:
    """``queen_push`` (query ``log_push``) of one message per txn into one partition; one row per item
    (status, seq, ...). ``deadlines_ms``: each message's deadline in milliseconds from now (None: none)."""
    n = len(txns)
    push = Push(tenant=tenant, plain=[], queues=[queue] * n, partitions=[partition] * n,
                ids=[uuid.uuid4() for _ in range(n)], txns=list(txns), traces=[None] * n, payloads=[payload] * n,
                codecs=[0] * n, key_ids=[None] * n, subs=[None] * n,
                deadline_ms=list(deadlines_ms) if deadlines_ms is not None else [None] * n)
    return await conn.fetch(push.query, *push.args())


async def sql_apply(conn: asyncpg.Connection, tenant: str, ops: Sequence[tuple[str, str, str]], *,
                    delay_ms: int = 3_600_000, payload: bytes = b'{"x":1}') -> list[str]:
    """``queen_timers_apply`` (through Q.timers_apply) of ``(op, queue, key)`` triples, each schedule with
    txn ``t-<key>`` and ``delay_ms``; the statuses, in op order."""
    call = apply_call(tenant, ops, payloads=[payload] * len(ops), delay_ms=delay_ms)
    rows = await conn.fetch(Q.timers_apply, *call.args())
    assert [r["idx"] for r in rows] == list(range(1, len(ops) + 1))
    return [r["status"] for r in rows]


async def sql_pop(conn: asyncpg.Connection, tenant: str, queue: str, *, partition: str | None = None,
                  group: str = QUEUE_MODE, batch: int = 1, auto_ack: bool = False) -> list[asyncpg.Record]:
    """``queen_pop`` (one partition at most); the delivered messages only (kind 'msg')."""
    pop = Pop(tenant=tenant, queue=queue, partition=partition, group=group, batch=batch, max_partitions=1,
              auto_ack=auto_ack)
    rows = await conn.fetch(Q.log_pop, *pop.args())
    return [r for r in rows if r["kind"] == "msg"]


async def sql_ack(conn: asyncpg.Connection, tenant: str, msgs: Sequence[Any], *, group: str = QUEUE_MODE,
                  status: str = "completed", lease: bool = True) -> list[asyncpg.Record]:
    """``queen_ack`` of popped messages (with their lease ids unless ``lease=False``); one row per item."""
    n = len(msgs)
    ack = Ack(tenant=tenant, pids=[m["partition_id"] for m in msgs], txns=[m["txn"] for m in msgs],
              statuses=[status] * n, leases=[m["lease_id"] if lease else None for m in msgs], groups=[group] * n,
              errors=[None] * n)
    return await conn.fetch(Q.log_ack, *ack.args())


# ------------------------------------------------------------------------------- brokers and clients


def authed(secret: str, broker: LocalBroker, tenant: str, sub: str = "svc",
           grants: Sequence[str] = ("produce", "consume")) -> Api:
    """An ``Api`` on ``broker`` whose requests carry an HS256 token (signed with ``secret``) for
    ``tenant``/``sub`` with ``grants``."""
    token = mint(tenant=tenant, sub=sub, grants=list(grants), secret=secret)
    return Api(httpx.Client(base_url=broker.url, timeout=30, headers={"Authorization": f"Bearer {token}"}))


@contextmanager
def dedicated_broker(pg: Any, tmp_path_factory: Any, name: str, env: dict[str, str], workers: int = 2) -> Iterator[LocalBroker]:
    """A ``queen serve`` of a test module's own, on a fresh database, logging to ``<tmp>/<name>.log``."""
    log_dir: Path = tmp_path_factory.mktemp(name)
    b = LocalBroker(dsn=pg.new_db(), workers=workers, env=env, log_path=log_dir / f"{name}.log")
    b.start()
    try:
        yield b
    finally:
        b.stop()


# ---------------------------------------------------------------------------------------- refusals


def refused(r: httpx.Response, status: int, code: str, reason: str | None = None) -> dict:
    """Assert ``r`` is the error envelope with this status, ``error`` code and (when given) ``reason``."""
    assert r.status_code == status, r.text
    body = r.json()
    assert body["error"] == code, body
    if reason is not None:
        assert body["reason"] == reason, body
    return body


# -------------------------------------------------------------------------------- request fragments


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def timer_op(queue: str, key: str, txn: str | None = None, *, delay: int = 60_000, payload: bytes = b'{"k": 1}',
             op: str = "schedule", **extra: Any) -> dict:
    """A schedule (or ``op=``reschedule) operation of ``POST /api/v1/timers``; a fresh txn unless given."""
    return {"op": op, "queue": queue, "timerKey": key, "payload": b64(payload), "delayMs": delay,
            "txn": txn or uuid.uuid4().hex, **extra}


def push_op(queue: str, *txns: str) -> dict:
    """A transaction push operation with one item per txn (payload ``{"t": txn}``)."""
    return {"type": "push", "items": [{"queue": queue, "payload": {"t": t}, "transactionId": t} for t in txns]}


def ack_op(m: dict, **kw: Any) -> dict:
    """A transaction ack operation completing the popped message ``m``."""
    return {"type": "ack", "transactionId": m["transactionId"], "partitionId": m["partitionId"], "status": "completed",
            "leaseId": m["leaseId"], **kw}


def acquire_op(name: str, owner: str, ttl: int = 30, **kw: Any) -> dict:
    """A lock acquire (``limit=`` makes it a semaphore's)."""
    return {"op": "acquire", "name": name, "ttlSeconds": ttl, "owner": owner, **kw}


def kv_put(ns: str, key: str, value: Any, **kw: Any) -> dict:
    """A KV put that lives forever unless ``ttlSeconds`` is given."""
    op = {"op": "put", "ns": ns, "key": key, "value": value}
    if "ttlSeconds" not in kw:
        kw.setdefault("forever", True)
    op.update(kw)
    return op


# ------------------------------------------------------------------------------------------- the API


class Api:
    """The broker's routes over one ``httpx.Client`` (its base URL and credentials). Anything else is
    the client's own (``api.get(...)``, ``api.post(...)``), and ``with Api(...) as api:`` closes it."""

    def __init__(self, http: httpx.Client) -> None:
        self.http = http

    def __getattr__(self, name: str) -> Any:
        return getattr(self.http, name)

    def __enter__(self) -> Api:
        return self

    def __exit__(self, *exc: object) -> None:
        self.http.close()

    # -- message log
    def configure(self, queue: str, **options: Any) -> httpx.Response:
        r = self.http.post("/api/v1/configure", json={"queue": queue, "options": options})
        assert r.status_code == 200, r.text
        return r

    def push_items(self, items: list[dict]) -> httpx.Response:
        return self.http.post("/api/v1/push", json={"items": items})

    def push(self, queue: str, payloads: Sequence[Any], partition: str = "Default") -> list[dict]:
        """Push one item per payload; asserts 201."""
        r = self.push_items([{"queue": queue, "partition": partition, "payload": p} for p in payloads])
        assert r.status_code == 201, r.text
        return r.json()

    def push_n(self, queue: str, n: int = 1, partition: str = "p") -> httpx.Response:
        """Push ``n`` distinct messages (payload ``{"i": i}``, fresh transaction ids); the raw response."""
        return self.push_items([{"queue": queue, "partition": partition, "payload": {"i": i}, "transactionId": uuid.uuid4().hex}
                                for i in range(n)])

    def push_each(self, queue: str, items: list[dict]) -> list[dict]:
        """Push ``items`` (each completed with ``"queue": queue``); asserts 201."""
        r = self.push_items([{"queue": queue, **it} for it in items])
        assert r.status_code == 201, r.text
        return r.json()

    def pop_response(self, queue: str, **params: Any) -> httpx.Response:
        params.setdefault("wait", "false")
        return self.http.get(f"/api/v1/pop/queue/{queue}", params=params)

    def pop(self, queue: str, **params: Any) -> dict | None:
        """The pop answer (``None`` for 204); a non-waiting pop unless ``wait`` is given."""
        r = self.pop_response(queue, **params)
        assert r.status_code in (200, 204), r.text
        return r.json() if r.status_code == 200 else None

    def messages(self, queue: str, **params: Any) -> list[dict]:
        """The popped messages, ``[]`` when none."""
        ans = self.pop(queue, **params)
        return ans["messages"] if ans else []

    def pop_until(self, queue: str, n: int = 1, timeout: float = 10.0, batch: int | None = None) -> list[dict]:
        """Long-poll ``queue`` until at least ``n`` messages came (or ``timeout``); returns what came."""
        got: list[dict] = []
        deadline = time.monotonic() + timeout
        while len(got) < n and time.monotonic() < deadline:
            got += self.messages(queue, wait="true", timeout="1000", batch=str(batch or n))
        return got

    def delivered(self, queue: str, timeout: float = 10.0) -> list[dict]:
        """The messages of the first non-empty long-poll answer (up to 200); fails if none come."""
        msgs = self.pop_until(queue, 1, timeout, batch=200)
        assert msgs, f"nothing delivered to {queue} within {timeout}s"
        return msgs

    def ack(self, m: dict, status: str = "completed", error: str | None = None, **extra: Any) -> list[dict]:
        body = {"transactionId": m["transactionId"], "partitionId": m["partitionId"], "status": status, "error": error,
                "consumerGroup": None, "leaseId": m["leaseId"], **extra}
        r = self.http.post("/api/v1/ack", json=body)
        assert r.status_code == 200, r.text
        return r.json()

    def ack_all(self, msgs: list[dict], status: str = "completed", group: str | None = None) -> list[dict]:
        body = {"acknowledgments": [{"transactionId": m["transactionId"], "partitionId": m["partitionId"],
                                     "status": status, "leaseId": m["leaseId"], "error": None} for m in msgs],
                "consumerGroup": group}
        r = self.http.post("/api/v1/ack/batch", json=body)
        assert r.status_code == 200, r.text
        return r.json()

    def lookup(self, queue: str, txn: str) -> dict:
        r = self.http.get("/api/v1/messages/lookup", params={"queue": queue, "txn": txn})
        assert r.status_code == 200, r.text
        return r.json()

    def found(self, queue: str, txn: str) -> bool:
        """Whether a message with ``txn`` is in ``queue``."""
        return self.lookup(queue, txn)["found"]

    def transaction(self, body: dict) -> httpx.Response:
        return self.http.post("/api/v1/transaction", json=body)

    def tx(self, body: dict, status: int = 200) -> dict:
        """The transaction's answer body; asserts ``status``."""
        r = self.transaction(body)
        assert r.status_code == status, r.text
        return r.json()

    # -- timers
    def timers(self, *ops: dict) -> httpx.Response:
        return self.http.post("/api/v1/timers", json={"operations": list(ops)})

    def timer_results(self, *ops: dict) -> list[dict]:
        r = self.timers(*ops)
        assert r.status_code == 200, r.text
        return r.json()["results"]

    def cancel(self, queue: str, key: str, txn: str | None = None) -> httpx.Response:
        return self.http.delete(f"/api/v1/timers/{queue}/{key}", params={"txn": txn} if txn is not None else None)

    def peek(self, queue: str, key: str) -> httpx.Response:
        return self.http.get(f"/api/v1/timers/{queue}/{key}")

    def list_timers(self, queue: str, **params: Any) -> httpx.Response:
        return self.http.get(f"/api/v1/timers/{queue}", params=params)

    def wait_fired(self, queue: str, txn: str, timeout: float = 10.0) -> dict:
        """The lookup answer once the timer's message is in ``queue``."""
        return wait_for(lambda: (body := self.lookup(queue, txn)).get("found") and body, timeout,
                        f"timer {txn} of {queue} fired")

    # -- KV
    def kv(self, *ops: dict) -> httpx.Response:
        return self.http.post("/api/v1/kv", json={"operations": list(ops)})

    def kv_body(self, *ops: dict, status: int = 200) -> dict:
        r = self.kv(*ops)
        assert r.status_code == status, r.text
        return r.json()

    def kv_results(self, *ops: dict) -> list[dict]:
        return self.kv_body(*ops)["results"]

    def kv_one(self, op: dict) -> dict:
        """The one result of a one-op call; asserts 200 and that there is exactly one."""
        results = self.kv_results(op)
        assert len(results) == 1
        return results[0]

    # -- locks
    def locks(self, *ops: dict) -> httpx.Response:
        return self.http.post("/api/v1/locks", json={"operations": list(ops)})

    def lock_results(self, *ops: dict) -> list[dict]:
        """The results of a locks call; asserts 200 and exactly one result per op."""
        r = self.locks(*ops)
        assert r.status_code == 200, r.text
        results = r.json()["results"]
        assert len(results) == len(ops), results
        return results

    def lock_one(self, op: dict) -> dict:
        return self.lock_results(op)[0]
    # -- streams (/streams/v1/*)
    def stream_register(self, name: str, source: str, config_hash: str = "h1", **extra: Any) -> httpx.Response:
        return self.http.post("/streams/v1/queries", json={"name": name, "source_queue": source,
                                                           "config_hash": config_hash, "reset": False, **extra})

    def stream_query(self, name: str, source: str, config_hash: str = "h1", **extra: Any) -> str:
        """Register a stream query; asserts 200 and returns its query id."""
        r = self.stream_register(name, source, config_hash, **extra)
        assert r.status_code == 200, r.text
        return r.json()["query_id"]

    def cycle(self, query_id: str, partition_id: str, *, group: str = "g", state_ops: list | None = None,
              push_items: list | None = None, ack: dict | None = None, **extra: Any) -> httpx.Response:
        return self.http.post("/streams/v1/cycle", json={
            "query_id": query_id, "partition_id": partition_id, "consumer_group": group,
            "state_ops": state_ops or [], "push_items": push_items or [], "ack": ack, **extra})

    def state(self, query_id: str, partition_id: str, keys: Sequence[str] = (), **extra: Any) -> dict:
        """``{key: value}`` of one (query, partition); asserts 200."""
        r = self.http.post("/streams/v1/state/get", json={"query_id": query_id, "partition_id": partition_id,
                                                          "keys": list(keys), **extra})
        assert r.status_code == 200, r.text
        return {row["key"]: row["value"] for row in r.json()["rows"]}

    # -- ephemeral queues (/api/v1/ephemeral/*)
    def eph_configure(self, queue: str, **options: Any) -> dict:
        r = self.http.post("/api/v1/ephemeral/configure", json={"queue": queue, "options": options})
        assert r.status_code == 200, r.text
        return r.json()

    def eph_push_response(self, queue: str, payloads: Sequence[Any], partition: str | None = None) -> httpx.Response:
        body: dict[str, Any] = {"queue": queue, "messages": [{"payload": p} for p in payloads]}
        if partition is not None:
            body["partition"] = partition
        return self.http.post("/api/v1/ephemeral/push", json=body)

    def eph_push(self, queue: str, payloads: Sequence[Any], partition: str | None = None) -> dict:
        """Push ``payloads``; asserts 201 and that all of them went in."""
        r = self.eph_push_response(queue, payloads, partition)
        assert r.status_code == 201, r.text
        assert r.json()["pushed"] == len(payloads), r.text
        return r.json()

    def eph_pop(self, queue: str, **params: Any) -> list[dict]:
        """The messages of one ephemeral pop (``[]`` when none); asserts 200."""
        r = self.http.get("/api/v1/ephemeral/pop", params={"queue": queue, **params})
        assert r.status_code == 200, r.text
        assert r.json()["queue"] == queue
        return r.json()["messages"]

    def eph_ack(self, queue: str, msgs: Sequence[dict | str], status: str | None = None, group: str | None = None,
                error: str | None = None) -> list[str]:
        """Ack ``msgs`` (popped messages or ids); the outcomes in order."""
        acks = []
        for m in msgs:
            a: dict[str, Any] = {"id": m if isinstance(m, str) else m["id"]}
            if status is not None:
                a["status"] = status
            if error is not None:
                a["error"] = error
            acks.append(a)
        body: dict[str, Any] = {"queue": queue, "acks": acks}
        if group is not None:
            body["group"] = group
        r = self.http.post("/api/v1/ephemeral/ack", json=body)
        assert r.status_code == 200, r.text
        results = r.json()["results"]
        assert [x["id"] for x in results] == [a["id"] for a in acks]
        return [x["outcome"] for x in results]

    def eph_depth(self, queue: str) -> dict:
        r = self.http.get(f"/api/v1/ephemeral/queues/{queue}/depth")
        assert r.status_code == 200, r.text
        return r.json()
