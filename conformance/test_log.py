"""The message log (README "Message log", docs/protocol.md §2): push, pop, ack, leases, the DLQ,
lookups, configure, retention, encryption as the wire sees it, and transactions of pushes and acks.

Every queue is uuid-named, so the tests share nothing; lease timings use the smallest legal leaseTime
(1 s) and poll rather than sleep where the broker may take a moment.
"""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

import pytest

from conformance.client import (
    OK,
    assert_envelope,
    configured,
    empty_pop,
    expect,
    expect_error,
    poll,
    pushed,
    uniq,
)

contract = pytest.mark.contract

INVALID_LEASE = "Invalid or expired lease"


def _push(api, q: str, payloads: list[Any], *, partition: str = "Default", txns: list[str] | None = None) -> list[dict]:
    txns = txns or [uuid.uuid4().hex for _ in payloads]
    items = [{"queue": q, "partition": partition, "payload": p, "transactionId": t} for p, t in zip(payloads, txns, strict=True)]
    data = pushed(api.push_items(items))
    assert len(data) == len(items), data
    return data


def _configure(api, q: str, **options: Any) -> Any:
    """A configure that prepares a contract about something else (a setup step: any 2xx)."""
    return configured(api.configure(q, **options))


def _data(msgs: list[dict]) -> list[Any]:
    return [m.get("data") for m in msgs]


# ------------------------------------------------------------------------------------------ push


@contract("LOG-PUSH-ARRAY", "LOG-PUSH-QUEUED")
def test_push_answers_an_aligned_array(api):
    q = uniq("q")
    txns = [uuid.uuid4().hex for _ in range(3)]
    items = [{"queue": q, "partition": "Default", "payload": {"n": i}, "transactionId": t} for i, t in enumerate(txns)]
    resp = api.push_items(items)
    data = expect(resp, OK)
    assert isinstance(data, list) and len(data) == 3, data
    for i, (r, t) in enumerate(zip(data, txns, strict=True)):
        assert r.get("index") == i and r.get("transaction_id") == t, f"results[{i}] does not answer items[{i}]: {data}"
        assert r.get("status") == "queued" and r.get("queueName") == q, r
        assert isinstance(r.get("message_id"), str) and r["message_id"] and isinstance(r.get("partition_id"), str), r
    assert len({r["message_id"] for r in data}) == 3
    msgs = api.drain(q)
    assert [m["transactionId"] for m in msgs] == txns and _data(msgs) == [{"n": 0}, {"n": 1}, {"n": 2}], msgs
    assert [m["id"] for m in msgs] == [r["message_id"] for r in data], "the delivered ids are the pushed ones"


@contract("LOG-PUSH-EMPTY")
def test_push_empty(api):
    assert expect(api.push_items([]), OK) == []


@contract("LOG-PUSH-201")
def test_push_answers_201(api):
    q = uniq("q")
    item = {"queue": q, "partition": "Default", "payload": 1, "transactionId": uuid.uuid4().hex}
    expect(api.push_items([item]), 201)
    expect(api.push_items([item]), 201)  # the duplicate too
    expect(api.push_items([]), 201)


@contract("LOG-PUSH-DEDUPE")
def test_dedupe_across_calls(api):
    q, t = uniq("q"), uuid.uuid4().hex
    first = _push(api, q, [{"v": 1}], txns=[t])[0]
    again = _push(api, q, [{"v": 2}], txns=[t])[0]
    assert again["status"] == "duplicate", again
    assert again["message_id"] == first["message_id"], f"duplicate must carry the first message's id: {first} {again}"
    msgs = api.drain(q)
    assert _data(msgs) == [{"v": 1}], f"one message, the first: {msgs}"


@contract("LOG-PUSH-DEDUPE-IN-REQUEST")
def test_dedupe_within_one_request(api):
    q, t = uniq("q"), uuid.uuid4().hex
    res = _push(api, q, [{"v": 1}, {"v": 2}, {"v": 3}], txns=[t, t, uuid.uuid4().hex])
    assert [r["status"] for r in res] == ["queued", "duplicate", "queued"], res
    assert res[1]["message_id"] == res[0]["message_id"], res
    assert _data(api.drain(q)) == [{"v": 1}, {"v": 3}]


@contract("LOG-PUSH-DEDUPE-PER-PARTITION")
def test_dedupe_is_per_partition(api):
    q, t = uniq("q"), uuid.uuid4().hex
    a = _push(api, q, [{"p": "a"}], partition="pa", txns=[t])[0]
    b = _push(api, q, [{"p": "b"}], partition="pb", txns=[t])[0]
    assert a["status"] == "queued" and b["status"] == "queued", (a, b)
    assert a["message_id"] != b["message_id"]
    got = sorted(str(m["data"]) for m in api.drain(q))
    assert got == sorted([str({"p": "a"}), str({"p": "b"})]), got


@contract("LOG-PUSH-TXN-MINTED")
def test_missing_transaction_id_is_minted(api):
    q = uniq("q")
    data = expect(api.push_items([{"queue": q, "partition": "Default", "payload": {"x": 1}}]), OK)
    r = data[0]
    assert r["status"] == "queued" and r["transaction_id"] == r["message_id"], r
    assert api.stored(q, r["message_id"])


@contract("LOG-PUSH-ANY-JSON")
def test_payload_any_json(api):
    q = uniq("q")
    payloads = [None, 0, -1.5, "text", True, [], [1, {"a": None}], {"nested": {"deep": ["x"]}}, "\u00e9\u2603"]
    _push(api, q, payloads)
    assert _data(api.drain(q)) == payloads


@contract("LOG-PUSH-UNKNOWN-FIELD")
def test_unknown_item_field_refuses_the_request(api):
    q = uniq("q")
    good, bad = uuid.uuid4().hex, uuid.uuid4().hex
    items = [{"queue": q, "partition": "Default", "payload": 1, "transactionId": good},
             {"queue": q, "partition": "Default", "payload": 2, "transactionId": bad, "priorityBoost": 7}]
    expect_error(api.push_items(items), 400)
    assert not api.stored(q, good), "the valid item of a refused request was written"


@contract("LOG-PRODUCERSUB-STAMPED")
def test_producer_sub_is_the_credentials(api):
    if not api.sub:
        from conformance.plugin import not_verified

        not_verified("tenant A's token carries no sub claim to compare with")
    q, t = uniq("q"), uuid.uuid4().hex
    _push(api, q, [{"x": 1}], txns=[t])
    assert api.lookup(q, t).get("producerSub") == api.sub
    msgs = api.drain(q)
    assert msgs and msgs[0].get("producerSub") == api.sub, msgs


@contract("LOG-PAYLOAD-413-WHOLE")
def test_payload_over_plan_refuses_whole_request(api, plan):
    q = uniq("q")
    small, big = uuid.uuid4().hex, uuid.uuid4().hex
    items = [{"queue": q, "partition": "Default", "payload": "s", "transactionId": small},
             {"queue": q, "partition": "Default", "payload": "x" * plan["maxPayloadBytes"], "transactionId": big}]
    expect_error(api.push_items(items), 413, reason="payload_too_large")
    assert not api.stored(q, small) and not api.stored(q, big)


# ------------------------------------------------------------------------------------------ pop


@contract("LOG-POP-EMPTY")
def test_empty_pop_is_empty(api):
    q = uniq("q")
    _push(api, q, [1])
    api.drain(q)
    resp = api.pop_raw(q, wait=False, batch=10)
    assert resp.status_code in (200, 204) and empty_pop(resp), (resp.status_code, resp.text[:200])
    resp = api.pop_raw(uniq("never"), wait=False)
    assert resp.status_code in (200, 204) and empty_pop(resp), f"a queue that does not exist is empty: {resp.text[:200]}"


@contract("LOG-POP-204")
def test_empty_pop_is_204(api):
    q = uniq("q")
    _push(api, q, [1])
    api.drain(q)
    resp = api.pop_raw(q, wait=False, batch=10)
    assert resp.status_code == 204 and resp.content == b"", (resp.status_code, resp.text[:200])
    resp = api.pop_raw(uniq("never"), wait=False)
    assert resp.status_code == 204, "a queue that does not exist is empty"
    out: dict[str, Any] = {}
    _pop_in_thread(api, uniq("q"), 300, out).join(20)
    assert out.get("status") == 204, f"a long poll that times out answers 204: {out}"


@contract("LOG-POP-SHAPE")
def test_pop_shape(api):
    q, t = uniq("q"), uuid.uuid4().hex
    pushed = _push(api, q, [{"k": "v"}], txns=[t])[0]
    data = api.pop_leased(q, group="g")
    assert data is not None
    for k in ("leaseId", "partition", "partitionId", "consumerGroup"):
        assert k in data, f"pop answer lacks {k}: {data}"
    assert data["leaseId"] and data["consumerGroup"] == "g" and data["partition"] == "Default", data
    (m,) = data["messages"]
    for k in ("id", "transactionId", "partitionId", "data", "createdAt", "leaseId", "deliveryAttempt"):
        assert k in m, f"message lacks {k}: {m}"
    assert m["id"] == pushed["message_id"] and m["transactionId"] == t and m["data"] == {"k": "v"}, m
    assert m["partitionId"] == pushed["partition_id"] == data["partitionId"] and m["leaseId"] == data["leaseId"], m
    assert m["deliveryAttempt"] == 1, m
    assert api.ack(m)["success"] is True


@contract("LOG-POP-FIFO")
def test_fifo_per_partition(api):
    q = uniq("q")
    for chunk in ([0, 1, 2], [3], [4, 5, 6, 7]):
        _push(api, q, chunk)
    got: list[Any] = []
    while True:
        data = api.pop_leased(q, batch=3)
        if data is None:
            break
        got += _data(data["messages"])
        for m in data["messages"]:
            api.ack(m)
    assert got == list(range(8)), f"not FIFO: {got}"


@contract("LOG-POP-ONE-LEASE")
def test_one_lease_per_partition_and_group(api):
    q = uniq("q")
    _push(api, q, [1, 2, 3])
    first = api.pop_leased(q, group="g", batch=1)
    assert first is not None and _data(first["messages"]) == [1]
    assert api.pop_leased(q, group="g", batch=10, wait=False) is None, "a leased partition was handed to a second consumer"
    other = api.pop_leased(q, group="h", batch=10)
    assert other is not None and _data(other["messages"]) == [1, 2, 3], "another group is not held by g's lease"
    assert api.ack(first["messages"][0], group="g")["success"] is True  # the client acks with the pop's group
    nxt = api.pop_leased(q, group="g", batch=10)
    assert nxt is not None and _data(nxt["messages"]) == [2, 3], "the partition moves on once its lease is settled"


@contract("LOG-POP-QUEUE-MODE")
def test_queue_mode_competing_consumers(api):
    q = uniq("q")
    _push(api, q, [1, 2])
    one = api.pop_leased(q, batch=1)
    assert one is not None
    for m in one["messages"]:
        assert api.ack(m)["success"] is True
    two = api.pop_leased(q, batch=10)
    assert two is not None
    for m in two["messages"]:
        api.ack(m)
    assert _data(one["messages"]) + _data(two["messages"]) == [1, 2], "a message reached two queue-mode consumers"
    assert api.pop_leased(q, batch=10, wait=False) is None


@contract("LOG-POP-GROUPS-SEE-ALL")
def test_each_group_sees_every_message(api):
    q = uniq("q")
    _push(api, q, [1, 2, 3])
    for group in ("g1", "g2", None):
        data = api.pop_leased(q, group=group, batch=10)
        assert data is not None and _data(data["messages"]) == [1, 2, 3], f"group {group} did not see every message"
        for m in data["messages"]:
            assert api.ack(m, group=group)["success"] is True


@contract("LOG-POP-BATCH")
def test_batch_caps_the_pop(api):
    q = uniq("q")
    _push(api, q, list(range(5)))
    for n, want in ((1, [0]), (3, [1, 2, 3]), (3, [4])):
        resp = api.pop_raw(q, batch=n, wait=False, autoAck=True)
        data = expect(resp, 200)
        assert _data(data["messages"]) == want, f"batch={n}: {data['messages']}"


@contract("LOG-POP-BATCH-DEFAULT")
def test_default_batch(api, pytestconfig):
    n = int(pytestconfig.getoption("--queen-pop-default-batch"))
    q = uniq("q")
    _push(api, q, list(range(n + 1)))
    data = expect(api.pop_raw(q, wait=False, autoAck=True), 200)
    assert len(data["messages"]) == n, f"a pop without batch handed out {len(data['messages'])}, expected {n}"


def _pop_in_thread(api, q: str, timeout_ms: int, out: dict[str, Any]) -> threading.Thread:
    def run() -> None:
        t0 = time.monotonic()
        resp = api.pop_raw(q, batch=10, wait=True, timeout=timeout_ms, autoAck=True, timeout_s=30 + timeout_ms / 1000)
        out["elapsed"] = time.monotonic() - t0
        out["status"] = resp.status_code
        out["empty"] = empty_pop(resp)
        out["messages"] = (resp.json().get("messages") if resp.status_code == 200 else [])

    th = threading.Thread(target=run, daemon=True)
    th.start()
    return th


@contract("LOG-POP-WAIT-WOKEN")
def test_long_poll_woken_by_push(api):
    q = uniq("q")
    _push(api, q, [0])
    api.drain(q)  # the queue exists and is empty
    out: dict[str, Any] = {}
    th = _pop_in_thread(api, q, 8000, out)
    time.sleep(0.4)
    assert th.is_alive(), f"a long poll on an empty queue answered at once: {out}"
    _push(api, q, [{"woke": True}])
    th.join(12)
    assert out.get("status") == 200 and _data(out["messages"]) == [{"woke": True}], out
    assert out["elapsed"] < 6.0, f"woken only after {out['elapsed']:.2f}s of an 8 s poll"


@contract("LOG-POP-WAIT-TIMEOUT")
def test_long_poll_times_out(api):
    q = uniq("q")
    out: dict[str, Any] = {}
    _pop_in_thread(api, q, 700, out).join(20)
    assert out.get("status") in (200, 204) and out.get("empty"), out
    assert out["elapsed"] >= 0.65, f"answered after {out['elapsed']:.3f}s, before its 700 ms timeout"


@contract("LOG-POP-AUTOACK")
def test_auto_ack(api):
    q = uniq("q")
    _push(api, q, [1])
    data = expect(api.pop_raw(q, batch=10, wait=False, autoAck=True), 200)
    assert data.get("leaseId") == "" and _data(data["messages"]) == [1], data
    assert api.pop_leased(q, batch=10, wait=False) is None, "an auto-acked message was delivered again"


@contract("LOG-POP-SUB-NEW")
def test_subscription_new(api):
    q = uniq("q")
    _push(api, q, ["old"])
    for g, params in (("new-mode", {"subscriptionMode": "new"}), ("from-now", {"subscriptionFrom": "now"})):
        assert api.pop_leased(q, group=g, **params, wait=False) is None, f"{params}: the group's first pop saw history"
    _push(api, q, ["fresh"])
    for g in ("new-mode", "from-now"):
        data = api.pop_leased(q, group=g)
        assert data is not None and _data(data["messages"]) == ["fresh"], (g, data)


@contract("LOG-POP-SUB-ALL")
def test_subscription_default_all(api):
    q = uniq("q")
    _push(api, q, ["a", "b"])
    data = api.pop_leased(q, group="late-comer")
    assert data is not None and _data(data["messages"]) == ["a", "b"], data
    data = api.pop_leased(q, group="explicit", subscriptionMode="all")
    assert data is not None and _data(data["messages"]) == ["a", "b"], data


@contract("LOG-POP-PARTITION-ROUTE")
def test_pop_one_partition(api):
    q = uniq("q")
    _push(api, q, ["a1", "a2"], partition="pa")
    _push(api, q, ["b1"], partition="pb")
    data = expect(api.pop_raw(q, partition="pb", batch=10, wait=False, autoAck=True), 200)
    assert _data(data["messages"]) == ["b1"] and data.get("partition") == "pb", data
    resp = api.pop_raw(q, partition="pb", batch=10, wait=False, autoAck=True)
    assert empty_pop(resp), resp.text[:200]
    data = expect(api.pop_raw(q, partition="pa", batch=10, wait=False, autoAck=True), 200)
    assert _data(data["messages"]) == ["a1", "a2"], data


# ------------------------------------------------------------------------------------------ ack and leases


@contract("LOG-ACK-PER-ITEM", "LOG-ACK-COMPLETED")
def test_ack_batch_per_item(api):
    q = uniq("q")
    _push(api, q, [1, 2, 3])
    data = api.pop_leased(q, batch=10)
    assert data is not None
    m1, m2, m3 = data["messages"]
    body = {"acknowledgments": [
        {"transactionId": m1["transactionId"], "partitionId": m1["partitionId"], "status": "completed",
         "leaseId": m1["leaseId"]},
        {"transactionId": m2["transactionId"], "partitionId": m2["partitionId"], "status": "success",
         "leaseId": str(uuid.uuid4())},
        {"transactionId": m3["transactionId"], "partitionId": m3["partitionId"], "status": "completed",
         "leaseId": m3["leaseId"]},
    ]}
    res = expect(api.http.post("/api/v1/ack/batch", json=body), 200)
    assert isinstance(res, list) and len(res) == 3, res
    assert [r.get("success") for r in res] == [True, False, True], res
    assert res[1].get("error") == INVALID_LEASE and not res[0].get("error"), res
    for r in res:
        assert "dlq" in r, r
    # m2 is still under the live lease: settle it, then nothing is left
    assert api.ack(m2)["success"] is True
    assert api.pop_leased(q, batch=10, wait=False) is None, "a completed message was delivered again"


@contract("LOG-ACK-WRONG-LEASE", "LOG-LEASE-EXPIRY")
def test_expired_lease_redelivers_and_refuses_old_ack(api):
    q = uniq("q")
    _configure(api, q, leaseTime=1)
    _push(api, q, ["m"])
    first = api.pop_leased(q, group="g")
    assert first is not None
    old = first["messages"][0]
    assert old["deliveryAttempt"] == 1
    second = poll(lambda: api.pop_leased(q, group="g"), timeout=8, what="redelivery after the 1 s lease ran out")
    new = second["messages"][0]
    assert new["transactionId"] == old["transactionId"] and new["deliveryAttempt"] == 2, new
    assert second["leaseId"] != first["leaseId"]
    r = api.ack(old, group="g")
    assert r["success"] is False and r["error"] == INVALID_LEASE, f"an ack under the expired lease: {r}"
    r = api.ack(new, lease=str(uuid.uuid4()), group="g")
    assert r["success"] is False and r["error"] == INVALID_LEASE, f"an ack under a made-up lease: {r}"
    assert api.ack(new, group="g")["success"] is True


@contract("LOG-ACK-IDEMPOTENT")
def test_ack_idempotent(api):
    q = uniq("q")
    _push(api, q, [1])
    data = api.pop_leased(q, group="g")
    m = data["messages"][0]
    assert api.ack(m, group="g")["success"] is True
    again = api.ack(m, group="g")
    assert again["success"] is True, f"acking a done message again: {again}"
    assert api.ack(m, lease=None, group="g")["success"] is True


@contract("LOG-ACK-FAILED-REDELIVERS")
def test_nack_redelivers_the_rest_of_the_partition(api):
    q = uniq("q")
    _push(api, q, ["a", "b", "c"])
    data = api.pop_leased(q, group="g")
    a, b, c = data["messages"]
    assert api.ack(a, group="g")["success"] is True
    assert api.ack(b, status="failed", group="g", error="boom")["success"] is True
    again = api.pop_leased(q, group="g")
    assert again is not None and _data(again["messages"]) == ["b", "c"], again
    b2, c2 = again["messages"]
    assert b2["deliveryAttempt"] == 2, b2
    assert api.ack(b2, status="retry", group="g")["success"] is True
    third = api.pop_leased(q, group="g")
    assert third is not None and _data(third["messages"]) == ["b", "c"] and third["messages"][0]["deliveryAttempt"] == 3
    for m in third["messages"]:
        api.ack(m, group="g")


@contract("LOG-ACK-NO-LEASE")
def test_ack_without_lease(api):
    q = uniq("q")
    res = _push(api, q, ["x", "y", "z"])
    # group g reads the partition (x, committed at delivery), then settles y without a lease
    data = expect(api.pop_raw(q, batch=1, wait=False, autoAck=True, consumerGroup="g"), 200)
    assert _data(data["messages"]) == ["x"]
    y = {"transactionId": res[1]["transaction_id"], "partitionId": res[1]["partition_id"]}
    r = api.ack(y, lease=None, group="g")
    assert r["success"] is True, r
    data = api.pop_leased(q, group="g")
    assert data is not None and _data(data["messages"]) == ["z"], f"the lease-less ack did not settle y for g: {data}"
    # z is under a live lease now: a lease-less ack does not settle it
    z = data["messages"][0]
    r = api.ack(z, lease=None, group="g")
    assert r["success"] is False and r.get("error"), f"a lease-less ack settled a leased message: {r}"
    assert api.ack(z, group="g")["success"] is True
    other = api.pop_leased(q, group="h")
    assert other is not None and _data(other["messages"]) == ["x", "y", "z"], "it settled y for another group too"


@contract("LOG-ACK-DLQ-STATUS", "LOG-DLQ-LIST")
def test_ack_dlq_files_a_dead_letter(api):
    q = uniq("q")
    _push(api, q, ["poison", "fine"])
    data = api.pop_leased(q, group="g", batch=1)
    m = data["messages"][0]
    r = api.ack(m, status="dlq", group="g", error="cannot parse")
    assert r["success"] is True, r
    rows = poll(lambda: api.dlq(q), timeout=5, what="the dead letter")
    assert [x.get("transactionId") for x in rows] == [m["transactionId"]], rows
    assert "cannot parse" in str(rows[0].get("errorMessage") or rows[0].get("error")), rows[0]
    page = expect(api.http.get("/api/v1/dlq", params={"queue": q, "consumerGroup": "g"}), 200)
    # the client reads messages, and total with a default of 0 (queen/builders/dlq_builder.py): a total,
    # when there is one, must be right
    assert isinstance(page.get("messages"), list) and len(page["messages"]) == 1, page
    assert page.get("total", 1) == 1, page
    other = expect(api.http.get("/api/v1/dlq", params={"queue": q, "consumerGroup": "not-g"}), 200)
    assert other["messages"] == [] and other.get("total", 0) == 0, other
    rest = api.pop_leased(q, group="g")
    assert rest is not None and _data(rest["messages"]) == ["fine"], rest


def _nack_until_gone(api, q: str, group: str, error: str) -> int:
    """Pop and nack until the message stops coming back; the number of deliveries."""
    n = 0
    while True:
        data = api.pop_leased(q, group=group, batch=1)
        if data is None:
            return n
        n += 1
        assert n < 20, "a nacked message kept coming back"
        m = data["messages"][0]
        assert m["deliveryAttempt"] == n, m
        assert api.ack(m, status="failed", group=group, error=error)["success"] is True


def _exhausted(api) -> tuple[str, str, list[dict]]:
    """A message nacked past retryLimit 2: (queue, txn, its DLQ rows)."""
    q = uniq("q")
    _configure(api, q, retryLimit=2)
    t = uuid.uuid4().hex
    _push(api, q, [{"order": 7}], txns=[t])
    assert _nack_until_gone(api, q, "g", "downstream 502") == 3, "retryLimit 2 means three deliveries"
    rows = poll(lambda: api.dlq(q), timeout=5, what="the exhausted message in the DLQ")
    return q, t, rows


@contract("LOG-RETRY-LIMIT-DLQ")
def test_retry_limit_then_dlq(api):
    q, t, rows = _exhausted(api)
    assert len(rows) == 1 and rows[0].get("transactionId") == t, rows
    assert "downstream 502" in str(rows[0].get("errorMessage") or rows[0].get("error")), rows[0]
    assert api.pop_leased(q, group="g", wait=False) is None, "an exhausted message was delivered again"


@contract("LOG-DLQ-REPLAY", "LOG-DLQ-REPLAY-IDEMPOTENT")
def test_dlq_replay(api):
    q, t, rows = _exhausted(api)
    if len(rows) != 1 or rows[0].get("transactionId") != t:
        from conformance.client import not_verified

        not_verified(f"setup step failed (a message exhausted into the DLQ): {rows}")
    dlq_id = rows[0].get("id")
    assert dlq_id, rows[0]
    rep = expect(api.http.post(f"/api/v1/dlq/{dlq_id}/replay"), 200)
    want_txn = f"{t}:replay:{dlq_id}"
    assert rep.get("transactionId") == want_txn, rep
    assert api.dlq(q) == [], "the replayed row is still in the DLQ"
    found = api.lookup(q, want_txn)
    assert found["found"] is True and found["partition"] == "Default", found
    again = api.http.post(f"/api/v1/dlq/{dlq_id}/replay")
    if again.status_code == 200:
        assert again.json().get("messageId") == rep.get("messageId"), again.text
    else:
        assert 400 <= again.status_code < 500, again.text
        assert_envelope(again)
    msgs = api.drain(q)
    replays = [m for m in msgs if m["transactionId"] == want_txn]
    assert len(replays) == 1 and replays[0]["data"] == {"order": 7}, msgs


@contract("LOG-DLQ-OFF-DROPS")
def test_no_dlq_drops(api):
    q = uniq("q")
    _configure(api, q, retryLimit=0, dlqAfterMaxRetries=False)
    _push(api, q, ["doomed", "next"])
    data = api.pop_leased(q, group="g", batch=1)
    assert api.ack(data["messages"][0], status="failed", group="g")["success"] is True
    rest = api.pop_leased(q, group="g")
    assert rest is not None and _data(rest["messages"]) == ["next"], rest
    assert api.dlq(q) == []


def _extended(api) -> tuple[dict, dict, dict, float]:
    """A 1 s lease extended once: (the pop answer, its message, the extend answer, when it was sent); the
    pop answer carries the queue's name as "queue"."""
    q = uniq("q")
    _configure(api, q, leaseTime=1)
    _push(api, q, ["m"])
    data = api.pop_leased(q, group="g")
    if data is None:
        from conformance.client import not_verified

        not_verified("setup step failed (pop): the pushed message was not handed out")
    t0 = time.time()
    ext = expect(api.http.post(f"/api/v1/lease/{data['leaseId']}/extend"), 200)
    ext = ext[0] if isinstance(ext, list) else ext
    return {**data, "queue": q}, data["messages"][0], ext, t0


@contract("EDGE-LEASE-EXTEND-S")
def test_lease_extend_span(api, pytestconfig):
    from conformance.client import parse_ts

    extend_s = float(pytestconfig.getoption("--queen-lease-extend-s"))
    data, m, ext, t0 = _extended(api)
    until = parse_ts(ext["newExpiresAt"])
    assert until <= time.time() + extend_s + 5.0, f"extended to {until - t0:.1f}s from now, far more than {extend_s}s"
    assert api.ack(m, group="g")["success"] is True


@contract("LOG-LEASE-EXTEND")
def test_lease_extend(api, pytestconfig):
    extend_s = float(pytestconfig.getoption("--queen-lease-extend-s"))
    data, m, ext, t0 = _extended(api)
    assert ext.get("success") is True and ext.get("leaseId") == data["leaseId"], ext
    assert isinstance(ext.get("renewed"), int) and ext["renewed"] >= 1, ext
    from conformance.client import parse_ts

    until = parse_ts(ext["newExpiresAt"])
    assert until >= t0 + extend_s - 1.0, f"extended to {until - t0:.1f}s from now, less than {extend_s}s"
    time.sleep(1.5)  # past the 1 s leaseTime: the extended lease still holds
    assert api.pop_leased(data["queue"], group="g", wait=False) is None, "the partition was handed out again under an extended lease"
    assert api.ack(m, group="g")["success"] is True


@contract("LOG-LEASE-EXTEND-GONE")
def test_lease_extend_gone(api):
    resp = api.http.post(f"/api/v1/lease/{uuid.uuid4()}/extend")
    ext = expect(resp, 200)
    ext = ext[0] if isinstance(ext, list) else ext
    assert ext.get("success") is False, ext


# ------------------------------------------------------------------------------------------ lookups, configure


@contract("LOG-LOOKUP")
def test_lookup(api):
    q, t = uniq("q"), uuid.uuid4().hex
    pushed = _push(api, q, [{"a": 1}], partition="pp", txns=[t])[0]
    found = api.lookup(q, t)
    assert found["found"] is True, found
    assert found["queue"] == q and found["partition"] == "pp" and found["transactionId"] == t, found
    assert found["messageId"] == pushed["message_id"] and found["partitionId"] == pushed["partition_id"], found
    assert "producerSub" in found and isinstance(found.get("createdAt"), str), found
    miss = api.lookup(q, "no-such-txn")
    assert miss == {"found": False, "queue": q, "transactionId": "no-such-txn"} or (
        miss["found"] is False and miss.get("transactionId") == "no-such-txn"), miss


@contract("LOG-MESSAGE-GET")
def test_message_get(api):
    q, t = uniq("q"), uuid.uuid4().hex
    pushed = _push(api, q, [{"deep": [1, 2]}], txns=[t])[0]
    got = expect(api.http.get(f"/api/v1/messages/{pushed['partition_id']}/{t}"), 200)
    assert got.get("data") == {"deep": [1, 2]} and got.get("transactionId") == t, got
    expect_error(api.http.get(f"/api/v1/messages/{pushed['partition_id']}/nope-{t}"), 404, reason="message_not_found")


@contract("LOG-CONFIGURE")
def test_configure(api):
    q = uniq("q")
    data = expect(api.configure(q, leaseTime=30, retryLimit=5), 200)
    assert isinstance(data, dict) and data.get("configured") is True and data.get("queue") == q, data
    assert data["options"].get("leaseTime") == 30 and data["options"].get("retryLimit") == 5, data
    resp = api.configure(uniq("q"), leaseTime=30, visibilityBoost=2)
    err = expect_error(resp, 400, reason="unknown_option")
    assert "visibilityBoost" in err["detail"] or err.get("option") == "visibilityBoost", err
    fresh = uniq("q")
    _push(api, fresh, [1])
    info = expect(api.http.get(f"/api/v1/resources/queues/{fresh}"), 200)
    assert info["options"].get("retryLimit") == 3 and info["options"].get("leaseTime") == 300, info


@contract("LOG-TENANT-ISOLATION")
def test_log_tenant_isolation(api, api_b):
    q, t = uniq("q"), uuid.uuid4().hex
    _push(api, q, ["secret"], txns=[t])
    data = api.pop_leased(q, group="g", batch=1)
    m = data["messages"][0]
    assert empty_pop(api_b.pop_raw(q, wait=False, batch=10)), "tenant B popped tenant A's queue"
    assert api_b.lookup(q, t)["found"] is False
    r = api_b.ack(m, group="g")
    assert r["success"] is False, f"tenant B acked tenant A's message: {r}"
    assert api.ack(m, status="dlq", group="g", error="x")["success"] is True
    poll(lambda: api.dlq(q), timeout=5, what="tenant A's dead letter")
    assert api_b.dlq(q) == [], "tenant B sees tenant A's DLQ"


# ------------------------------------------------------------------------------------------ retention, encryption


@contract("LOG-RETENTION")
def test_retention(api, target):
    q, keep = uniq("q"), uniq("q")
    _configure(api, q, retentionSeconds=1)
    t, k = uuid.uuid4().hex, uuid.uuid4().hex
    _push(api, q, ["old"], txns=[t])
    _push(api, keep, ["kept"], txns=[k])
    # (that it was stored is the push's "queued"; asking again here would race the 1 s retention on a busy host)
    poll(lambda: not api.stored(q, t), timeout=target.fire_timeout, what="the message gone after retentionSeconds")
    assert empty_pop(api.pop_raw(q, wait=False))
    assert api.stored(keep, k), "a queue without retention lost a message"


@contract("LOG-COMPLETED-RETENTION")
def test_completed_retention(api, target):
    q = uniq("q")
    _configure(api, q, completedRetentionSeconds=1)
    t1, t2 = uuid.uuid4().hex, uuid.uuid4().hex
    _push(api, q, ["done", "pending"], txns=[t1, t2])
    data = expect(api.pop_raw(q, batch=1, wait=False, autoAck=True), 200)
    assert _data(data["messages"]) == ["done"]
    poll(lambda: not api.stored(q, t1), timeout=target.fire_timeout, what="the completed message deleted")
    assert api.stored(q, t2), "a message nobody has done was deleted"


@contract("LOG-ENCRYPTION-TRANSPARENT")
def test_encryption_invisible_on_the_wire(api):
    q = uniq("q")
    resp = api.configure(q, encryptionEnabled=True)
    if resp.status_code == 400:
        expect_error(resp, 400, reason="encryption_unavailable")
        return
    expect(resp, 200)
    t = uuid.uuid4().hex
    payload = {"card": "4111", "n": [1, 2, 3], "s": "\u00e9"}
    _push(api, q, [payload], txns=[t])
    assert api.stored(q, t)
    msgs = api.drain(q)
    assert _data(msgs) == [payload], msgs


# ------------------------------------------------------------------------------------------ transactions


@contract("LOG-TXN-PUSH-ACK")
def test_transaction_push_and_ack(api):
    src, dst = uniq("q"), uniq("q")
    _push(api, src, ["in"])
    data = api.pop_leased(src, group="g")
    m = data["messages"][0]
    t1, t2 = uuid.uuid4().hex, uuid.uuid4().hex
    body = {"operations": [
        {"type": "push", "items": [{"queue": dst, "payload": "o1", "transactionId": t1},
                                   {"queue": dst, "payload": "o2", "transactionId": t2}]},
        {"type": "ack", "transactionId": m["transactionId"], "partitionId": m["partitionId"], "status": "completed",
         "consumerGroup": "g", "leaseId": m["leaseId"]},
    ], "requiredLeases": [m["leaseId"]]}
    res = expect(api.http.post("/api/v1/transaction", json=body), 200)
    assert res.get("success") is True, res
    assert len(res["results"]) == 3, f"results are flat: two pushed items and one ack: {res}"
    assert [r.get("transactionId") for r in res["results"][:2]] == [t1, t2], res
    assert api.pop_leased(src, group="g", wait=False) is None, "the ack of the transaction did not apply"
    assert _data(api.drain(dst)) == ["o1", "o2"]


@contract("LOG-TXN-REFUSED-200")
def test_refused_transaction_applies_nothing(api):
    src, dst = uniq("q"), uniq("q")
    _push(api, src, ["a", "b"])
    data = api.pop_leased(src, group="g")
    a, b = data["messages"]
    t = uuid.uuid4().hex
    body = {"operations": [
        {"type": "ack", "transactionId": a["transactionId"], "partitionId": a["partitionId"], "status": "completed",
         "consumerGroup": "g", "leaseId": a["leaseId"]},
        {"type": "push", "items": [{"queue": dst, "payload": "out", "transactionId": t}]},
        {"type": "ack", "transactionId": b["transactionId"], "partitionId": b["partitionId"], "status": "completed",
         "consumerGroup": "g", "leaseId": str(uuid.uuid4())},
    ]}
    res = expect(api.http.post("/api/v1/transaction", json=body), 200)
    # what the client reads (docs/protocol.md §2.6): success false with an error; reason, failedIndex and an
    # empty results list are this broker's extra detail, checked only where given
    assert res.get("success") is False and isinstance(res.get("error"), str) and res["error"], res
    assert res.get("reason") in ("ack_refused", "lease_invalid", None), res
    assert res.get("failedIndex") in (2, None), res
    assert not api.stored(dst, t), "the push of a refused bundle was applied"
    # the first ack was not applied either: both messages are still under the live lease
    assert api.ack(a, group="g")["success"] is True and api.ack(b, group="g")["success"] is True


@contract("LOG-TXN-MALFORMED-400")
def test_malformed_transaction(api):
    q, t = uniq("q"), uuid.uuid4().hex
    for body in ({"operations": "push"}, {"operations": [{"type": "teleport"}]},
                 {"operations": [{"type": "push", "items": [{"queue": q, "payload": 1, "transactionId": t}]},
                                 {"type": "push", "items": "nope"}]}):
        expect_error(api.http.post("/api/v1/transaction", json=body), 400)
    assert not api.stored(q, t)
