"""Ephemeral queues (docs/protocol.md §6, broker/ephemeral/): every route, the refusals, the bounds with
both policies, TTL and lease expiry by the database clock, redelivery and the retry limit, fan-out and
competing consumers, the long poll woken by a push through another broker, tenancy, grants and
admission; and the contents' tables being UNLOGGED (lost on a database crash, by design)."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest
from conftest import uniq
from helpers import Api, authed, db_fetch, refused, wait_for

SECRET = "ephemeral-test-secret"


def test_every_route_round_trip(api):
    q = uniq("eph")
    conf = api.eph_configure(q, maxLength=10, leaseSeconds=30, retryLimit=2, windowBuffer={"ms": 0, "count": 0})
    assert conf["declared"] is True and conf["options"]["maxLength"] == 10 and conf["options"]["retryLimit"] == 2
    assert conf["options"]["policy"] == "reject"  # not given: the default
    assert api.eph_push(q, [{"a": 1}, [1, 2], None, "s"], partition="p1") == {"pushed": 4, "dropped": 0}
    msgs = api.eph_pop(q, batch=10)
    assert [m["payload"] for m in msgs] == [{"a": 1}, [1, 2], None, "s"]  # FIFO, payloads verbatim
    assert {m["partition"] for m in msgs} == {"p1"} and {m["attempts"] for m in msgs} == {1}
    assert len({m["id"] for m in msgs}) == 4
    depth = api.eph_depth(q)
    assert depth["depth"] == 4 and depth["inFlight"] == 4 and depth["tier"] == "declared"
    assert depth["groupDetails"] == [{"group": "__QUEUE_MODE__", "pending": 0, "inFlight": 4}]
    assert depth["partitionDetails"][0]["partition"] == "p1" and depth["partitionDetails"][0]["pending"] == 4
    assert api.eph_ack(q, msgs[:2]) == ["acked", "acked"]
    assert api.eph_ack(q, msgs[:1]) == ["unknown"]  # already settled
    assert api.eph_depth(q)["depth"] == 2  # acked messages leave the ring
    listed = {x["queue"]: x for x in api.get("/api/v1/ephemeral/queues").json()["queues"]}
    assert listed[q]["depth"] == 2 and listed[q]["options"]["maxLength"] == 10
    r = api.post("/api/v1/ephemeral/reset", json={"queue": q})
    assert r.status_code == 200 and r.json() == {"queue": q, "dropped": 2}
    assert api.eph_ack(q, msgs[2:]) == ["unknown", "unknown"]  # reset voided the leases
    assert api.eph_depth(q)["options"]["maxLength"] == 10  # the declaration stays
    r = api.delete(f"/api/v1/ephemeral/queue/{q}")
    assert r.status_code == 200 and r.json() == {"queue": q, "deleted": True}
    assert api.delete(f"/api/v1/ephemeral/queue/{q}").json()["deleted"] is False
    refused(api.get(f"/api/v1/ephemeral/queues/{q}/depth"), 404, "ephemeral_queue_not_found")
    assert q not in {x["queue"] for x in api.get("/api/v1/ephemeral/queues").json()["queues"]}
    assert api.post("/api/v1/ephemeral/reset", json={"queue": q}).json()["dropped"] == 0
    metrics = api.get("/metrics").text
    for op in ("pushed", "popped", "acked", "unknown"):
        assert f'queen_ephemeral_messages_total{{op="{op}"}}' in metrics, op


def test_push_and_pop_create_an_implicit_queue_with_the_defaults(api):
    q = uniq("eph-impl")
    assert api.eph_pop(q) == []
    d = api.eph_depth(q)
    assert d["tier"] == "implicit" and d["depth"] == 0
    assert d["options"] == {"maxBytes": 67108864, "maxLength": 100000, "policy": "reject", "ttlSeconds": 0,
                            "leaseSeconds": 30, "retryLimit": 3, "windowBuffer": {"ms": 0, "count": 0}}
    api.eph_push(q, [1])
    assert [m["payload"] for m in api.eph_pop(q)] == [1]  # batch defaults to 1
    api.eph_configure(q, ttlSeconds=60)
    d = api.eph_depth(q)
    assert d["tier"] == "declared" and d["options"]["ttlSeconds"] == 60 and d["options"]["maxLength"] == 100000


@pytest.mark.parametrize(("body", "reason"), [
    ({"queue": "q", "options": {"maxLenght": 3}}, "unknown_option"),
    ({"queue": "q", "options": {"maxLength": 0}}, "bad_option"),
    ({"queue": "q", "options": {"maxLength": True}}, "bad_option"),
    ({"queue": "q", "options": {"ttlSeconds": 1.5}}, "bad_option"),
    ({"queue": "q", "options": {"policy": "drop"}}, "bad_option"),
    ({"queue": "q", "options": {"windowBuffer": 5}}, "bad_option"),
    ({"queue": "q", "options": {"windowBuffer": {"ms": 5, "size": 2}}}, "bad_option"),
    ({"queue": "q", "options": {"leaseSeconds": 0}}, "bad_option"),
    ({"queue": "q", "options": {"retryLimit": None}}, "bad_option"),  # null is not "left out"
    ({"queue": "q", "options": {"policy": None}}, "bad_option"),
    ({"queue": "q", "options": {"windowBuffer": None}}, "bad_option"),
    ({"queue": "q", "options": {"windowBuffer": {"ms": None}}}, "bad_option"),
    ({"queue": "q", "options": []}, "bad_options"),
    ({"queue": "", "options": {}}, "bad_name"),
    ({"queue": "q", "extra": 1}, "unknown_field"),
])
def test_configure_refusals_change_nothing(api, body, reason):
    q = uniq("eph-bad")
    body = {**body, "queue": q if body["queue"] else ""}
    refused(api.post("/api/v1/ephemeral/configure", json=body), 400, "bad_request", reason)
    refused(api.get(f"/api/v1/ephemeral/queues/{q}/depth"), 404, "ephemeral_queue_not_found")


@pytest.mark.parametrize(("body", "reason"), [
    ({"messages": [{"payload": 1, "transactionId": "t"}]}, "bad_message"),
    ({"messages": [1]}, "bad_message"),
    ({"messages": {"payload": 1}}, "bad_messages"),
    ({"messages": [{"payload": 1}], "partition": ""}, "bad_name"),
    ({"messages": [{"payload": 1}], "items": []}, "unknown_field"),
    ({"messages": [{"payload": {"s": "nul\u0000"}}]}, "bad_payload"),
])
def test_push_refusals_change_nothing(api, body, reason):
    q = uniq("eph-bad")
    refused(api.post("/api/v1/ephemeral/push", json={"queue": q, **body}), 400, "bad_request", reason)
    refused(api.get(f"/api/v1/ephemeral/queues/{q}/depth"), 404, "ephemeral_queue_not_found")


def test_a_null_partition_is_the_default_one(api):
    """As the OpenAPI document says: `partition: null` on a push is the field absent."""
    q = uniq("eph-null")
    r = api.http.post("/api/v1/ephemeral/push", json={"queue": q, "partition": None, "messages": [{"payload": 1}]})
    assert r.status_code == 201 and r.json()["pushed"] == 1, r.text
    api.eph_push(q, [2])
    assert [(m["partition"], m["payload"]) for m in api.eph_pop(q, batch=10)] == [("Default", 1), ("Default", 2)]


def test_pop_and_ack_refusals(api):
    refused(api.get("/api/v1/ephemeral/pop"), 400, "bad_request", "bad_name")
    refused(api.get("/api/v1/ephemeral/pop", params={"queue": "q", "batch": "x"}), 400, "bad_request", "bad_query")
    refused(api.get("/api/v1/ephemeral/pop", params={"queue": "q", "wait": "maybe"}), 400, "bad_request", "bad_query")
    for acks, reason in [({"id": "a", "status": "dlq"}, "bad_ack_status"), ({"id": ""}, "bad_ack"),
                         ({"id": "a", "leaseId": "x"}, "unknown_field"), ({"id": "a", "error": 5}, "bad_ack"),
                         ({"id": "a", "error": "n\u0000l"}, "bad_ack")]:
        refused(api.post("/api/v1/ephemeral/ack", json={"queue": "q", "acks": [acks]}), 400, "bad_request", reason)
    for group in ("", None, 5):  # a group given must be a name: never read as the queue mode
        refused(api.post("/api/v1/ephemeral/ack", json={"queue": "q", "group": group, "acks": [{"id": "a"}]}),
                400, "bad_request", "bad_name")
    # an id this broker never minted is not an error: the outcome says it
    assert api.eph_ack(uniq("eph"), ["not-an-id", "x.1.1", "a\u0000.1.1", "x.\u00b2.1"]) == \
        ["unknown", "stale", "unknown", "unknown"]


def test_reject_policy_refuses_with_429_and_changes_nothing(api):
    q = uniq("eph-full")
    api.eph_configure(q, maxLength=3)
    api.eph_push(q, [1, 2])
    r = api.eph_push_response(q, [3, 4])  # all or nothing: 3 would fit, 4 would not
    body = refused(r, 429, "queue_full")
    assert r.headers["Retry-After"] == "1" and "nothing was pushed" in body["detail"]
    assert api.eph_depth(q)["depth"] == 2
    api.eph_push(q, [3])
    refused(api.eph_push_response(q, [4]), 429, "queue_full")
    # consuming frees room
    msgs = api.eph_pop(q, batch=3)
    assert api.eph_ack(q, msgs[:1]) == ["acked"]
    api.eph_push(q, [4])
    assert [m["payload"] for m in api.eph_pop(q, batch=5)] == [4]
    # a batch larger than the bounds themselves can never fit: 400, not 429
    refused(api.eph_push_response(q, [1, 2, 3, 4]), 400, "bad_request", "exceeds_bounds")
    # maxBytes: each payload's JSON text counts ("xxxxxxxx" is 10 bytes)
    qb = uniq("eph-bytes")
    api.eph_configure(qb, maxBytes=25)
    api.eph_push(qb, ["x" * 8, "y" * 8])
    refused(api.eph_push_response(qb, ["z" * 8]), 429, "queue_full")
    assert api.eph_depth(qb)["bytes"] == 20


def test_drop_oldest_policy_makes_room_and_counts_the_drops(api):
    q = uniq("eph-feed")
    api.eph_configure(q, maxLength=3, policy="dropOldest")
    api.eph_push(q, [1, 2, 3])
    assert api.eph_push(q, [4, 5]) == {"pushed": 2, "dropped": 2}
    d = api.eph_depth(q)
    assert d["depth"] == 3 and d["drops"] == {"bounds": 2, "ttl": 0, "retry": 0}
    assert [m["payload"] for m in api.eph_pop(q, batch=10)] == [3, 4, 5]
    qb = uniq("eph-feed-bytes")
    api.eph_configure(qb, maxBytes=30, policy="dropOldest")
    api.eph_push(qb, ["a" * 8, "b" * 8, "c" * 8])  # 30 bytes
    assert api.eph_push(qb, ["d" * 18])["dropped"] == 2  # 20 bytes: two of 10 must go
    assert [m["payload"] for m in api.eph_pop(qb, batch=10)] == ["c" * 8, "d" * 18]


def test_ttl_drops_old_messages_by_the_database_clock(api):
    q = uniq("eph-ttl")
    api.eph_configure(q, ttlSeconds=1)
    api.eph_push(q, ["old"])
    time.sleep(1.3)
    api.eph_push(q, ["new"])
    assert [m["payload"] for m in api.eph_pop(q, batch=10)] == ["new"]
    assert api.eph_depth(q)["drops"]["ttl"] == 1


def test_lease_expiry_redelivers_with_attempts_then_the_retry_limit_drops(api):
    q = uniq("eph-lease")
    api.eph_configure(q, leaseSeconds=1, retryLimit=1)
    api.eph_push(q, ["m"])
    first = api.eph_pop(q)
    assert first[0]["attempts"] == 1
    assert api.eph_pop(q) == []  # leased: nobody else gets it
    t0 = time.monotonic()
    second = api.eph_pop(q, wait="true", timeout="10000")  # woken when the lease runs out, not at 10 s
    assert time.monotonic() - t0 < 4
    assert second[0]["payload"] == "m" and second[0]["attempts"] == 2 and second[0]["id"] != first[0]["id"]
    assert api.eph_ack(q, first) == ["unknown"]  # the old delivery's ack touches nothing
    time.sleep(1.2)
    assert api.eph_pop(q) == []  # the retry limit (1) is spent: dropped, counted
    d = api.eph_depth(q)
    assert d["drops"]["retry"] == 1 and d["depth"] == 0 and d["inFlight"] == 0


def test_nack_redelivers_at_once_until_the_retry_limit(api):
    q = uniq("eph-nack")
    api.eph_configure(q, retryLimit=1)
    api.eph_push(q, ["m"])
    m1 = api.eph_pop(q)
    assert api.eph_ack(q, m1, status="retry", error="boom") == ["redelivered"]
    m2 = api.eph_pop(q)
    assert m2[0]["attempts"] == 2 and m2[0]["lastError"] == "boom"
    assert api.eph_ack(q, m2, status="failed") == ["acked"]  # the last attempt: settled by dropping it
    assert api.eph_pop(q) == []
    assert api.eph_depth(q)["drops"]["retry"] == 1


def test_groups_fan_out_and_auto_ack_commits_at_delivery(api):
    q = uniq("eph-groups")
    api.eph_push(q, [1, 2])
    a = api.eph_pop(q, group="a", batch=5)
    b = api.eph_pop(q, group="b", batch=5, autoAck="true")
    assert [m["payload"] for m in a] == [1, 2] == [m["payload"] for m in b]
    assert api.eph_pop(q, group="b", batch=5) == []  # autoAck: nothing to redeliver
    assert api.eph_depth(q)["depth"] == 2  # group a still holds them
    assert api.eph_ack(q, a, group="b") == ["unknown", "unknown"]  # cursors and leases are per group
    assert api.eph_ack(q, a, group="a") == ["acked", "acked"]
    assert api.eph_depth(q)["depth"] == 0  # every group is past them
    # a partition filter serves that partition only
    api.eph_push(q, ["x"], partition="px")
    api.eph_push(q, ["y"], partition="py")
    assert [m["payload"] for m in api.eph_pop(q, group="a", partition="py", autoAck="true")] == ["y"]


async def test_two_consumers_of_one_group_never_share_a_message(ahttp, api):
    q = uniq("eph-race")
    api.eph_push(q, list(range(300)))

    async def consume() -> list[str]:
        got: list[str] = []
        while True:
            r = await ahttp.get("/api/v1/ephemeral/pop", params={"queue": q, "group": "w", "batch": "7"})
            assert r.status_code == 200
            msgs = r.json()["messages"]
            if not msgs:
                return got
            got += [str(m["payload"]) for m in msgs]

    a, b = await asyncio.gather(consume(), consume())
    assert not set(a) & set(b)
    assert sorted(a + b, key=int) == [str(i) for i in range(300)]


def test_long_poll_is_woken_by_a_push_through_another_broker(broker, start_broker, api):
    other = start_broker(dsn=broker.dsn, workers=1)
    q = uniq("eph-wake")
    api.eph_pop(q)  # the queue exists, so the pop below waits on it
    with Api(httpx.Client(base_url=other.url, timeout=30)) as via_other:
        import threading

        out: dict[str, object] = {}

        def wait() -> None:
            t0 = time.monotonic()
            out["msgs"] = api.eph_pop(q, wait="true", timeout="10000")
            out["took"] = time.monotonic() - t0

        th = threading.Thread(target=wait)
        th.start()
        time.sleep(0.5)
        via_other.eph_push(q, ["hello"])
        th.join(15)
    assert [m["payload"] for m in out["msgs"]] == ["hello"]  # type: ignore[union-attr]
    assert out["took"] < 5, out  # woken by the NOTIFY, not by the timeout


def test_a_waiting_pop_times_out_empty_and_the_window_buffer_fattens_a_batch(api):
    q = uniq("eph-window")
    t0 = time.monotonic()
    assert api.eph_pop(q, wait="true", timeout="300") == []
    assert 0.25 < time.monotonic() - t0 < 5
    api.eph_configure(q, windowBuffer={"ms": 1500, "count": 3})
    api.eph_push(q, [1])

    import threading

    th = threading.Thread(target=lambda: (time.sleep(0.4), api.eph_push(q, [2, 3])))
    th.start()
    got = api.eph_pop(q, wait="true", timeout="5000", batch=10)
    th.join()
    assert [m["payload"] for m in got] == [1, 2, 3]  # waited for the window's count, not just the first


def test_contents_are_unlogged_and_the_declarations_are_not(broker):
    rows = db_fetch(broker.dsn, "SELECT relname, relpersistence::text AS p FROM pg_class WHERE relname LIKE 'queen_eph_%' "
                                "AND relkind = 'r' ORDER BY 1")
    persistence = {r["relname"]: r["p"] for r in rows}
    assert persistence.pop("queen_eph_queues") == "p"
    assert set(persistence) == {"queen_eph_messages", "queen_eph_cursors", "queen_eph_inflight", "queen_eph_stats",
                                "queen_eph_incarnation"}
    assert set(persistence.values()) == {"u"}


def test_tenancy_grants_and_admission(start_broker):
    b = start_broker(env={"QUEEN_JWT_SECRET": SECRET, "QUEEN_LIMITS_REFRESH_MS": "100"}, workers=1)
    q = uniq("eph-ten")
    with authed(SECRET, b, "acme", "svc") as a, authed(SECRET, b, "globex", "svc") as g, \
            authed(SECRET, b, "acme", "reader", ["consume"]) as reader, \
            authed(SECRET, b, "ops", grants=("admin",)) as admin:
        a.eph_push(q, ["secret"])
        # another tenant sees nothing of it and cannot touch it
        refused(g.get(f"/api/v1/ephemeral/queues/{q}/depth"), 404, "ephemeral_queue_not_found")
        assert q not in {x["queue"] for x in g.get("/api/v1/ephemeral/queues").json()["queues"]}
        assert g.post("/api/v1/ephemeral/reset", json={"queue": q}).json()["dropped"] == 0
        assert g.eph_pop(q, batch=10) == []  # its own (implicit, empty) queue of that name
        msgs = a.eph_pop(q)
        assert g.eph_ack(q, msgs) == ["stale"]  # another tenant's ids are never its own
        assert a.eph_ack(q, msgs) == ["acked"]
        # grants: push and configure need produce, delete needs admin
        refused(reader.eph_push_response(q, [1]), 403, "forbidden", "missing_grant")
        refused(reader.post("/api/v1/ephemeral/configure", json={"queue": q}), 403, "forbidden", "missing_grant")
        refused(a.delete(f"/api/v1/ephemeral/queue/{q}"), 403, "forbidden", "missing_grant")
        assert reader.eph_pop(q) == []
        # admission: push passes limits.admit like the log's push (period quota of 3 messages)
        r = admin.put("/api/v1/admin/tenants/acme/plan", json={"periodQuotaMessages": 3})
        assert r.status_code == 200, r.text
        time.sleep(0.3)
        a.eph_push(q, [1])  # 1 + the first push = 2 used
        refused(a.eph_push_response(q, [2, 3]), 429, "quota_exceeded")
        wait_for(lambda: a.eph_depth(q)["depth"] == 1, what="the refused push changed nothing")


def test_the_ring_keeps_a_message_until_every_registered_group_has_passed_it(api):
    q = uniq("eph-fan")
    assert api.eph_pop(q, group="slow") == []  # registers the group
    api.eph_push(q, ["m"])
    fast = api.eph_pop(q, group="fast")
    assert api.eph_ack(q, fast, group="fast") == ["acked"]
    assert api.eph_depth(q)["depth"] == 1  # "slow" has not seen it yet
    assert [m["payload"] for m in api.eph_pop(q, group="slow", autoAck="true")] == ["m"]
    assert api.eph_depth(q)["depth"] == 0
    # a group that first pops after the ring dropped a message never sees it
    api.eph_push(q, ["n"])
    api.eph_pop(q, group="fast", autoAck="true")
    api.eph_pop(q, group="slow", autoAck="true")
    assert api.eph_pop(q, group="late") == []


def test_the_expiry_loop_frees_the_room_of_queues_nobody_touches(start_broker):
    b = start_broker(env={"QUEEN_EPHEMERAL_EXPIRY_INTERVAL_MS": "100", "QUEEN_EPHEMERAL_IDLE_S": "2"}, workers=1)
    q = uniq("eph-idle")
    idle, busy, declared = uniq("eph-idle-impl"), uniq("eph-idle-full"), uniq("eph-idle-decl")
    with Api(httpx.Client(base_url=b.url, timeout=30)) as a:
        a.eph_pop(idle)
        a.eph_push(busy, ["kept"])
        a.eph_configure(declared)
        a.eph_configure(q, ttlSeconds=1)
        a.eph_push(q, [1, 2, 3])
        assert "ephemeral-expiry" in a.get("/health").json()["loops"]

        def rows() -> int:
            return db_fetch(b.dsn, "SELECT count(*) AS n FROM queen_eph_messages WHERE queue = $1", q)[0]["n"]

        assert rows() == 3
        wait_for(lambda: rows() == 0, timeout=10, what="the expiry loop dropping the expired messages")
        # counted without any push or pop having touched the queue
        stats = db_fetch(b.dsn, "SELECT depth, dropped_ttl FROM queen_eph_stats WHERE queue = $1", q)[0]
        assert (stats["depth"], stats["dropped_ttl"]) == (0, 3)
        # an implicit queue empty and idle for QUEEN_EPHEMERAL_IDLE_S is forgotten; one holding a
        # message, and a declared one, stay
        wait_for(lambda: a.get(f"/api/v1/ephemeral/queues/{idle}/depth").status_code == 404, timeout=10,
                 what="the idle implicit queue forgotten")
        assert a.eph_depth(busy)["depth"] == 1
        assert a.eph_depth(declared)["tier"] == "declared"
        assert [m["payload"] for m in a.eph_pop(busy)] == ["kept"]


async def test_bounds_hold_under_concurrent_pushes_and_order_is_fifo(ahttp, api):
    q = uniq("eph-bound")
    api.eph_configure(q, maxLength=50)

    async def pusher(k: int) -> list[int]:
        out = []
        for i in range(30):
            r = await ahttp.post("/api/v1/ephemeral/push", json={"queue": q, "messages": [{"payload": k * 100 + i}]})
            out.append(r.status_code)
        return out

    statuses = [s for part in await asyncio.gather(*(pusher(k) for k in range(4))) for s in part]
    assert statuses.count(201) == 50 and statuses.count(429) == 70, statuses
    d = api.eph_depth(q)
    assert d["depth"] == 50 and d["pending"] == 50
    # one big push keeps its order
    q2 = uniq("eph-order")
    api.eph_push(q2, list(range(500)))
    assert [m["payload"] for m in api.eph_pop(q2, batch=500, autoAck="true")] == list(range(500))


async def test_concurrent_acks_of_two_groups_leave_nothing_behind(ahttp, api):
    q = uniq("eph-settle")
    for g in ("a", "b"):
        api.eph_pop(q, group=g)
    api.eph_push(q, list(range(120)))
    held = {g: api.eph_pop(q, group=g, batch=120) for g in ("a", "b")}
    assert all(len(m) == 120 for m in held.values())

    async def settle(g: str) -> None:
        for i in range(0, 120, 4):
            r = await ahttp.post("/api/v1/ephemeral/ack",
                                 json={"queue": q, "group": g, "acks": [{"id": m["id"]} for m in held[g][i:i + 4]]})
            assert {x["outcome"] for x in r.json()["results"]} == {"acked"}

    await asyncio.gather(settle("a"), settle("b"))
    d = api.eph_depth(q)
    assert d["depth"] == 0 and d["inFlight"] == 0, d


def test_a_database_crash_empties_the_contents_and_keeps_the_declarations(controlled_pg, start_broker):
    """What the class promises and what it gives up (docs/protocol.md §6): PostgreSQL's crash recovery
    resets the UNLOGGED contents; the declaration survives; an id minted before the crash is stale."""
    ctl = controlled_pg.controller
    b = start_broker(dsn=controlled_pg.new_db(template=False), workers=1)
    q = uniq("eph-crash")
    with Api(httpx.Client(base_url=b.url, timeout=30)) as a:
        a.eph_configure(q, maxLength=9)
        a.eph_push(q, ["lost", "too"])
        held = a.eph_pop(q)
        try:
            ctl.pg_ctl("stop", "-m", "immediate")  # a crash: no shutdown checkpoint, recovery at start
        finally:
            ctl.pg_ctl("start")
            ctl.refresh()

        def depth() -> dict | None:
            try:
                r = a.get(f"/api/v1/ephemeral/queues/{q}/depth")
            except httpx.TransportError:
                return None
            return r.json() if r.status_code == 200 else None

        d = wait_for(depth, timeout=30, what="the broker serving again after the database's recovery")
        assert d["depth"] == 0 and d["tier"] == "declared" and d["options"]["maxLength"] == 9, d
        assert a.eph_pop(q, batch=10) == []
        assert a.eph_ack(q, held) == ["stale"]
        a.eph_push(q, ["after"])
        assert [m["payload"] for m in a.eph_pop(q)] == ["after"]
