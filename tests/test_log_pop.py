"""Pop through HTTP: FIFO per partition, consumer groups, queue mode, one lease per (partition, group),
subscription modes, autoAck, long poll (wake-up by NOTIFY, timeout, drain), lease expiry and extend."""

from __future__ import annotations

import threading
import time

import httpx
from conftest import uniq

from loadtest import prom


def test_pop_shape_fifo_and_batch(api):
    q = uniq("pop")
    api.push(q, [{"n": i} for i in range(5)])
    ans = api.pop(q, batch=3)
    assert ans["success"] is True and ans["queue"] == q and ans["partition"] == "Default"
    assert ans["consumerGroup"] == "__QUEUE_MODE__" and ans["partitionsClaimed"] == 1
    msgs = ans["messages"]
    assert [m["data"]["n"] for m in msgs] == [0, 1, 2] and [m["offset"] for m in msgs] == [1, 2, 3]
    m = msgs[0]
    assert set(m) >= {"id", "transactionId", "traceId", "data", "producerSub", "createdAt", "partitionId", "partition",
                      "leaseId", "consumerGroup", "deliveryAttempt", "offset"}
    assert isinstance(m["partitionId"], str) and m["leaseId"] == ans["leaseId"] and m["deliveryAttempt"] == 1
    assert len(m["createdAt"]) == 24 and m["createdAt"].endswith("Z")
    # one lease per (partition, group): the partition is taken until acked
    assert api.pop(q) is None
    assert all(r["success"] for r in api.ack_all(msgs))
    rest = api.pop(q, batch=10)["messages"]
    assert [m["data"]["n"] for m in rest] == [3, 4]


def test_each_message_carries_its_own_push_instant(api):
    """createdAt is each message's own: messages of one push share it (one statement, one instant), and a
    pop over several pushes renders each push's (the render formats it once per run of equal values)."""
    q = uniq("cat")
    for k in range(3):
        api.push(q, [{"k": k, "i": i} for i in range(2)])
        time.sleep(0.01)
    msgs = api.pop(q, batch=10)["messages"]
    assert [(m["data"]["k"], m["data"]["i"]) for m in msgs] == [(k, i) for k in range(3) for i in range(2)]
    at = [m["createdAt"] for m in msgs]
    assert at[0] == at[1] and at[2] == at[3] and at[4] == at[5]
    assert at[0] < at[2] < at[4]

def test_default_batch_and_unknown_params_ignored(api):
    q = uniq("defb")
    api.push(q, list(range(250)))
    ans = api.pop(q, autopilot="true", somethingNew="1")
    assert len(ans["messages"]) == 200


def test_bad_pop_params_are_400(http):
    q = uniq("badp")
    for params in ({"batch": "abc"}, {"timeout": "x"}, {"wait": "maybe"}, {"subscriptionMode": "latest"},
                   {"subscriptionFrom": "yesterday"}, {"conflation": "true"}, {"frames": "maybe"}):
        r = http.get(f"/api/v1/pop/queue/{q}", params=params)
        assert r.status_code == 400, params
        assert r.json()["reason"]


def test_pop_of_unknown_queue_is_204(http):
    assert http.get(f"/api/v1/pop/queue/{uniq('none')}?wait=false").status_code == 204


def test_consumer_groups_each_see_every_message(api):
    q = uniq("groups")
    api.push(q, [1, 2, 3])
    a = api.pop(q, consumerGroup="a", batch=10)["messages"]
    b = api.pop(q, consumerGroup="b", batch=10)["messages"]
    assert [m["data"] for m in a] == [1, 2, 3] == [m["data"] for m in b]
    assert a[0]["consumerGroup"] == "a"
    api.ack_all(a, group="a")
    assert api.pop(q, consumerGroup="a") is None
    # group b's lease is still live; queue mode is its own group and sees everything too
    assert [m["data"] for m in api.pop(q, batch=10)["messages"]] == [1, 2, 3]


def test_queue_mode_competing_consumers_take_different_partitions(api):
    q = uniq("compete")
    for p in ("p1", "p2", "p3"):
        api.push(q, [p + "-a", p + "-b"], partition=p)
    seen = []
    for _ in range(3):
        ans = api.pop(q, batch=10)
        seen.append(ans["partition"])
        assert {m["partition"] for m in ans["messages"]} == {ans["partition"]}
    assert sorted(seen) == ["p1", "p2", "p3"]
    assert api.pop(q) is None


def test_multi_partition_pop_shares_one_lease(http, api):
    q = uniq("multi")
    for p in ("p1", "p2"):
        api.push(q, [p], partition=p)
    ans = api.pop(q, partitions=2, batch=10)
    assert ans["partitionsClaimed"] == 2 and len({m["leaseId"] for m in ans["messages"]}) == 1
    ext = http.post(f"/api/v1/lease/{ans['leaseId']}/extend").json()
    assert ext["success"] is True and ext["renewed"] == 2


def test_autopilot_without_partitions_lets_one_pop_sweep_every_ready_partition(api):
    q = uniq("apilot")
    for p in ("p1", "p2", "p3"):
        api.push(q, [f"{p}-a", f"{p}-b"], partition=p)
    # what the official client sends by default (autopilot on, width left to the broker)
    ans = api.pop(q, autopilot="true", batch=100, autoAck="true")
    assert ans["partitionsClaimed"] == 3
    assert sorted(m["data"] for m in ans["messages"]) == ["p1-a", "p1-b", "p2-a", "p2-b", "p3-a", "p3-b"]
    # each partition's messages keep their order inside the answer
    assert [m["data"] for m in ans["messages"] if m["partition"] == "p2"] == ["p2-a", "p2-b"]
    assert api.pop(q, autopilot="true", autoAck="true") is None


def test_autopilot_keeps_an_explicit_width_and_the_batch_bounds_it(api):
    q = uniq("apin")
    for p in ("p1", "p2", "p3"):
        api.push(q, [p], partition=p)
    one = api.pop(q, autopilot="true", partitions="1", batch=100, autoAck="true")  # pinned: never second-guessed
    assert one["partitionsClaimed"] == 1 and len(one["messages"]) == 1
    two = api.pop(q, autopilot="true", batch=2, autoAck="true")  # never wider than the batch
    assert two["partitionsClaimed"] == 2 and len(two["messages"]) == 2
    assert api.pop(q, autopilot="true", autoAck="true") is None


def test_without_autopilot_a_pop_claims_one_partition(api):
    q = uniq("apioff")
    for p in ("p1", "p2", "p3"):
        api.push(q, [p], partition=p)
    for value in (None, "false", "maybe"):  # absent or any other value: the default width 1
        params = {"batch": 100} if value is None else {"batch": 100, "autopilot": value}
        ans = api.pop(q, **params)
        assert ans["partitionsClaimed"] == 1 and len(ans["messages"]) == 1
        assert all(r["success"] for r in api.ack_all(ans["messages"]))


def test_partition_route_pops_only_that_partition(http, api):
    q = uniq("route")
    api.push(q, ["x"], partition="one")
    api.push(q, ["y"], partition="two")
    ans = http.get(f"/api/v1/pop/queue/{q}/partition/two?wait=false").json()
    assert [m["data"] for m in ans["messages"]] == ["y"]


def test_subscription_mode_new_skips_history(api):
    q = uniq("subnew")
    api.push(q, ["old"])
    assert api.pop(q, consumerGroup="late", subscriptionMode="new") is None
    api.push(q, ["fresh"])
    assert [m["data"] for m in api.pop(q, consumerGroup="late")["messages"]] == ["fresh"]
    # subscriptionFrom=now behaves the same for a new group; an "all" group sees history
    assert api.pop(q, consumerGroup="now-group", subscriptionFrom="now") is None
    assert [m["data"] for m in api.pop(q, consumerGroup="all-group", batch=5)["messages"]] == ["old", "fresh"]


def test_auto_ack_commits_at_delivery(api):
    q = uniq("auto")
    api.push(q, [1, 2])
    ans = api.pop(q, autoAck="true", batch=1)
    assert ans["leaseId"] == "" and ans["messages"][0]["leaseId"] == ""
    assert [m["data"] for m in api.pop(q, autoAck="true", batch=5)["messages"]] == [2]
    assert api.pop(q) is None


def test_long_poll_is_woken_by_a_push(http, broker, api):
    q = uniq("wake")
    api.push(q, ["prime"])
    api.ack_all(api.pop(q)["messages"])
    out = {}

    def waiter():
        with httpx.Client(base_url=broker.url, timeout=30) as c:
            t0 = time.perf_counter()
            r = c.get(f"/api/v1/pop/queue/{q}", params={"wait": "true", "timeout": 10_000})
            out["status"], out["t"], out["body"] = r.status_code, time.perf_counter(), r.json()
            out["t0"] = t0

    woken_before = _wake_count(http)
    th = threading.Thread(target=waiter)
    th.start()
    time.sleep(0.4)  # the waiter is parked by now
    pushed = time.perf_counter()
    api.push(q, ["hello"])
    th.join(15)
    assert out["status"] == 200 and out["body"]["messages"][0]["data"] == "hello"
    assert out["t"] - pushed < 1.0, f"woke {out['t'] - pushed:.3f}s after the push"
    # The answer came from the NOTIFY wake-up (queen_pop_wake_seconds counts notify-woken answers),
    # not from a timeout or a re-poll.
    assert _wake_count(http) >= woken_before + 1


def _wake_count(http) -> float:
    return prom.parse(http.get("/metrics/prometheus").text).hist("queen_pop_wake_seconds").count


def test_long_poll_times_out_with_204(http):
    q = uniq("tmo")
    t0 = time.perf_counter()
    r = http.get(f"/api/v1/pop/queue/{q}", params={"wait": "true", "timeout": 300})
    assert r.status_code == 204 and r.content == b""
    assert 0.25 < time.perf_counter() - t0 < 5


def test_lease_expiry_redelivers_and_old_lease_is_refused(http, api):
    q = uniq("expire")
    api.configure(q, leaseTime=1, retryLimit=5)
    api.push(q, ["m1", "m2"])
    first = api.pop(q, batch=10)["messages"]
    assert [m["deliveryAttempt"] for m in first] == [1, 1]
    # the redelivery is found by a waiting pop when the lease runs out (no push needed)
    t0 = time.perf_counter()
    again = http.get(f"/api/v1/pop/queue/{q}", params={"wait": "true", "timeout": 5000, "batch": 10}).json()["messages"]
    assert time.perf_counter() - t0 < 3
    assert [m["data"] for m in again] == ["m1", "m2"] and [m["deliveryAttempt"] for m in again] == [2, 2]
    assert again[0]["leaseId"] != first[0]["leaseId"]
    stale = api.ack_all(first)
    assert stale[0]["success"] is False and stale[0]["error"] == "Invalid or expired lease"
    assert all(r["success"] for r in api.ack_all(again))
    assert api.pop(q) is None


def test_lease_extend(http, api):
    q = uniq("ext")
    api.configure(q, leaseTime=1)
    api.push(q, ["x"])
    ans = api.pop(q)
    r = http.post(f"/api/v1/lease/{ans['leaseId']}/extend")  # no body, no content type: like the client
    assert r.status_code == 200
    body = r.json()
    assert body["success"] is True and body["renewed"] == 1 and body["newExpiresAt"] == body["expiresAt"]
    time.sleep(1.2)
    assert api.pop(q) is None  # still leased thanks to the extension
    for bogus in ("not-a-lease", "8d3b4c1e-7d0a-4f55-9a8e-3d2c1b0a9f8e"):
        r = http.post(f"/api/v1/lease/{bogus}/extend")
        assert r.status_code == 200 and r.json()["success"] is False and r.json()["error"]


def test_long_poll_ends_promptly_when_the_worker_drains(start_broker):
    b = start_broker(workers=1)
    out = {}

    def waiter():
        with httpx.Client(base_url=b.url, timeout=30) as c:
            try:
                out["status"] = c.get(f"/api/v1/pop/queue/{uniq('drain')}", params={"wait": "true", "timeout": 30_000}).status_code
            except httpx.HTTPError as exc:
                out["status"] = type(exc).__name__
            out["t"] = time.perf_counter()

    th = threading.Thread(target=waiter)
    th.start()
    time.sleep(0.5)
    t0 = time.perf_counter()
    b.stop()
    th.join(15)
    assert out["status"] == 204
    assert out["t"] - t0 < 3


def test_pop_by_namespace_and_task(http, api):
    ns = uniq("ns")
    quiet, busy = uniq("quiet"), uniq("busy")
    for q in (quiet, busy):
        assert http.post("/api/v1/configure", json={"queue": q, "namespace": ns, "task": "t1"}).status_code == 200
    api.push(busy, ["work"])
    r = http.get("/api/v1/pop", params={"namespace": ns, "task": "t1", "wait": "false"})
    assert r.status_code == 200 and r.json()["queue"] == busy and r.json()["messages"][0]["data"] == "work"
    assert http.get("/api/v1/pop", params={"namespace": uniq("none"), "wait": "false"}).status_code == 204
    assert http.get("/api/v1/pop", params={"wait": "false"}).status_code == 400


def test_concurrent_consumers_get_every_message_exactly_once(broker):
    import asyncio

    from conftest import run_sync

    q = uniq("race")
    n_parts, per_part = 6, 40

    async def go():
        async with httpx.AsyncClient(base_url=broker.url, timeout=30) as c:
            await asyncio.gather(*[
                c.post("/api/v1/push", json={"items": [{"queue": q, "partition": f"p{p}", "payload": [p, i]}
                                                       for i in range(per_part)]}) for p in range(n_parts)])
            seen: list[tuple[int, int]] = []

            async def consumer():
                idle = 0
                while idle < 3:
                    r = await c.get(f"/api/v1/pop/queue/{q}", params={"batch": 7, "wait": "false"})
                    if r.status_code == 204:
                        idle += 1
                        await asyncio.sleep(0.05)
                        continue
                    idle = 0
                    msgs = r.json()["messages"]
                    seen.extend(tuple(m["data"]) for m in msgs)
                    res = await c.post("/api/v1/ack/batch", json={"acknowledgments": [
                        {"transactionId": m["transactionId"], "partitionId": m["partitionId"], "leaseId": m["leaseId"],
                         "status": "completed"} for m in msgs]})
                    assert all(x["success"] for x in res.json())

            await asyncio.gather(*[consumer() for _ in range(8)])
            return seen

    seen = run_sync(go())
    assert sorted(seen) == sorted((p, i) for p in range(n_parts) for i in range(per_part))
    # FIFO per partition across consumers
    for p in range(n_parts):
        assert [i for (pp, i) in seen if pp == p] == list(range(per_part))


def test_pushes_notify_only_while_a_long_poll_waits(http, broker):
    import asyncio

    import asyncpg
    from conftest import run_sync

    q = uniq("notify")

    async def go():
        got: list[str] = []
        conn = await asyncpg.connect(broker.dsn)
        await conn.add_listener("queen_push", lambda *a: got.append(a[-1]))
        try:
            async with httpx.AsyncClient(base_url=broker.url, timeout=30) as c:
                await c.post("/api/v1/push", json={"items": [{"queue": q, "payload": 0}]})
                await asyncio.sleep(0.3)
                quiet = [p for p in got if p.endswith("\t" + q)]
                await c.get(f"/api/v1/pop/queue/{q}", params={"wait": "false", "autoAck": "true"})  # consume it
                poll = asyncio.create_task(c.get(f"/api/v1/pop/queue/{q}", params={"wait": "true", "timeout": 10_000}))
                await asyncio.sleep(0.4)
                await c.post("/api/v1/push", json={"items": [{"queue": q, "payload": 1}]})
                r = await poll
                await asyncio.sleep(0.1)
                return quiet, [p for p in got if p.endswith("\t" + q)], r
        finally:
            await conn.close()

    quiet, loud, r = run_sync(go())
    assert quiet == []  # nobody waited: the push did not pay for a NOTIFY
    assert loud == [f"default\t{q}"] and r.status_code == 200 and r.json()["messages"][0]["data"] == 1
