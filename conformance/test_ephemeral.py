"""Ephemeral queues (docs/protocol.md §6): /api/v1/ephemeral/*, over HTTP only."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from conformance.client import expect, expect_error, poll, uniq

contract = pytest.mark.contract


def _ids(msgs: list[dict[str, Any]], **extra: Any) -> list[dict[str, Any]]:
    return [{"id": m["id"], **extra} for m in msgs]


@contract("EPH-CONFIGURE")
def test_configure_answers_the_effective_options_and_refuses_unknown_ones(api):
    q = uniq("eph")
    data = expect(api.eph_configure(q, maxLength=7, policy="dropOldest"), 200)
    opts = data["options"]
    assert opts["maxLength"] == 7 and opts["policy"] == "dropOldest", data
    assert {"maxBytes", "ttlSeconds", "leaseSeconds", "retryLimit", "windowBuffer"} <= set(opts), data
    for bad in ({"maxLenght": 3}, {"maxLength": -1}, {"policy": "sometimes"}, {"leaseSeconds": "10"}):
        q2 = uniq("eph")
        expect_error(api.eph_configure(q2, **bad), 400)
        expect_error(api.eph_depth(q2), 404, "ephemeral_queue_not_found")


@contract("EPH-PUSH-POP-SHAPE")
def test_push_then_pop_shape_and_fifo(api):
    q = uniq("eph")
    assert api.eph_pop(q) == []
    data = expect(api.eph_push(q, [{"a": 1}, [2], "three", None], partition="p1"), 201)
    assert data["pushed"] == 4, data
    expect(api.eph_push(q, ["other"], partition="p2"), 201)
    msgs = api.eph_pop(q, batch=10, partition="p1")
    assert [m["payload"] for m in msgs] == [{"a": 1}, [2], "three", None], msgs
    for m in msgs:
        assert isinstance(m["id"], str) and m["id"] and m["partition"] == "p1" and m["attempts"] == 1, m
    assert len({m["id"] for m in msgs}) == 4
    assert [m["payload"] for m in api.eph_pop(q, batch=10)] == ["other"]


@contract("EPH-POLICY-REJECT")
def test_reject_policy_refuses_the_whole_push(api):
    q = uniq("eph")
    expect(api.eph_configure(q, maxLength=2, policy="reject"), 200)
    expect(api.eph_push(q, [1]), 201)
    r = api.eph_push(q, [2, 3])
    expect_error(r, 429)
    assert r.headers.get("Retry-After"), "a 429 carries Retry-After"
    got = api.eph_pop(q, batch=10)
    assert [m["payload"] for m in got] == [1], "nothing of the refused push was stored"
    assert api.eph_ack(q, _ids(got)) == ["acked"]
    expect(api.eph_push(q, [2, 3]), 201)


@contract("EPH-POLICY-DROP-OLDEST")
def test_drop_oldest_policy_keeps_the_newest(api):
    q = uniq("eph")
    expect(api.eph_configure(q, maxLength=2, policy="dropOldest"), 200)
    expect(api.eph_push(q, [1, 2]), 201)
    expect(api.eph_push(q, [3]), 201)
    assert [m["payload"] for m in api.eph_pop(q, batch=10)] == [2, 3]
    depth = expect(api.eph_depth(q), 200)
    assert depth["drops"]["bounds"] == 1, depth


@contract("EPH-ACK-OUTCOMES")
def test_ack_outcomes(api):
    q = uniq("eph")
    expect(api.eph_push(q, ["a", "b"]), 201)
    a, b = api.eph_pop(q, batch=2)
    assert api.eph_ack(q, [{"id": a["id"]}, {"id": b["id"], "status": "retry"}]) == ["acked", "redelivered"]
    assert api.eph_ack(q, [{"id": a["id"]}]) == ["unknown"]
    again = api.eph_pop(q, batch=10)
    assert [(m["payload"], m["attempts"]) for m in again] == [("b", 2)], again


@contract("EPH-LEASE-REDELIVERY")
def test_an_unacked_message_comes_back_after_its_lease(api):
    q = uniq("eph")
    expect(api.eph_configure(q, leaseSeconds=1), 200)
    expect(api.eph_push(q, ["m"]), 201)
    first = api.eph_pop(q)
    assert api.eph_pop(q) == [], "a leased message went to a second consumer"
    back = poll(lambda: api.eph_pop(q), timeout=5, what="the redelivery after leaseSeconds")
    assert back[0]["payload"] == "m" and back[0]["attempts"] == 2, back
    assert api.eph_ack(q, _ids(first)) == ["unknown"]
    assert api.eph_ack(q, _ids(back)) == ["acked"]


@contract("EPH-RETRY-LIMIT")
def test_the_retry_limit_drops_the_message(api):
    q = uniq("eph")
    expect(api.eph_configure(q, retryLimit=1, leaseSeconds=1), 200)
    expect(api.eph_push(q, ["m"]), 201)
    first = api.eph_pop(q)
    assert api.eph_ack(q, _ids(first, status="failed")) == ["redelivered"]
    second = api.eph_pop(q)
    assert second and second[0]["attempts"] == 2, second
    time.sleep(1.3)  # its lease runs out: the limit is spent
    assert api.eph_pop(q, wait="true", timeout="500") == []
    depth = expect(api.eph_depth(q), 200)
    assert depth["drops"]["retry"] == 1, depth


@contract("EPH-TTL")
def test_messages_older_than_the_ttl_are_not_delivered(api):
    q = uniq("eph")
    expect(api.eph_configure(q, ttlSeconds=1), 200)
    expect(api.eph_push(q, ["old"]), 201)
    time.sleep(1.3)
    expect(api.eph_push(q, ["new"]), 201)
    assert [m["payload"] for m in api.eph_pop(q, batch=10)] == ["new"]


@contract("EPH-GROUPS")
def test_groups_fan_out_auto_ack_and_competing_consumers(api):
    q = uniq("eph")
    for g in ("g1", "g2"):
        assert api.eph_pop(q, group=g) == []
    expect(api.eph_push(q, [1, 2, 3]), 201)
    g1 = api.eph_pop(q, group="g1", batch=10, autoAck="true")
    g2 = api.eph_pop(q, group="g2", batch=10)
    assert [m["payload"] for m in g1] == [1, 2, 3] == [m["payload"] for m in g2]
    assert api.eph_pop(q, group="g1", batch=10) == [], "autoAck leaves nothing to redeliver"
    # competing consumers of one group: concurrent pops share the messages, never a message twice
    q2 = uniq("eph")
    expect(api.eph_push(q2, list(range(60))), 201)
    seen: list[list[Any]] = [[], []]

    def consume(i: int) -> None:
        while msgs := api.eph_pop(q2, group="w", batch=3):
            seen[i] += [m["payload"] for m in msgs]

    threads = [threading.Thread(target=consume, args=(i,)) for i in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not set(seen[0]) & set(seen[1]), "two consumers of one group got the same message"
    assert sorted(seen[0] + seen[1]) == list(range(60))


def _woken_by_a_push(waiter: Any, pusher: Any, q: str, payload: str) -> None:
    """A pop waiting on ``waiter`` is still waiting after 0.5 s, then answers ``payload`` within seconds of
    its push through ``pusher``."""
    out: dict[str, Any] = {}

    def wait() -> None:
        t0 = time.monotonic()
        out["msgs"] = waiter.eph_pop(q, wait="true", timeout="10000", timeout_s=40)
        out["elapsed"] = time.monotonic() - t0

    th = threading.Thread(target=wait, daemon=True)
    th.start()
    time.sleep(0.5)
    assert th.is_alive(), f"the waiting pop answered at once: {out}"
    expect(pusher.eph_push(q, [payload]), 201)
    th.join(15)
    assert [m["payload"] for m in out["msgs"]] == [payload], out
    assert out["elapsed"] < 4, out


@contract("EPH-WAIT-WOKEN")
def test_a_waiting_pop_is_woken_by_a_push(api):
    q = uniq("eph")
    t0 = time.monotonic()
    assert api.eph_pop(q, wait="true", timeout="300") == []
    assert time.monotonic() - t0 >= 0.25, "answered before its timeout"
    _woken_by_a_push(api, api, q, "wake")


@contract("EPH-RESET")
def test_reset_depth_and_list(api):
    q = uniq("eph")
    expect(api.eph_configure(q, maxLength=50), 200)
    expect(api.eph_push(q, [1, 2, 3]), 201)
    listed = {x["queue"]: x for x in expect(api.http.get("/api/v1/ephemeral/queues"), 200)["queues"]}
    assert listed[q]["tier"] == "declared", listed.get(q)
    assert expect(api.http.post("/api/v1/ephemeral/reset", json={"queue": q}), 200)["dropped"] == 3
    assert api.eph_pop(q) == []
    assert expect(api.eph_depth(q), 200)["options"]["maxLength"] == 50, "reset keeps the declaration"
    missing = uniq("eph")
    assert expect(api.http.post("/api/v1/ephemeral/reset", json={"queue": missing}), 200)["dropped"] == 0
    expect_error(api.eph_depth(missing), 404, "ephemeral_queue_not_found")


@contract("EPH-DELETE")
def test_delete_answers_deleted_true_then_false(admin):
    q = uniq("eph")
    expect(admin.api.eph_configure(q, maxLength=5), 200)
    assert expect(admin.api.http.delete(f"/api/v1/ephemeral/queue/{q}"), 200)["deleted"] is True
    expect_error(admin.api.eph_depth(q), 404, "ephemeral_queue_not_found")
    assert expect(admin.api.http.delete(f"/api/v1/ephemeral/queue/{q}"), 200)["deleted"] is False


@contract("EPH-TENANT-ISOLATION")
def test_another_tenant_sees_nothing(api, api_b):
    q = uniq("eph")
    expect(api.eph_push(q, ["mine"]), 201)
    expect_error(api_b.eph_depth(q), 404, "ephemeral_queue_not_found")
    assert q not in {x["queue"] for x in expect(api_b.http.get("/api/v1/ephemeral/queues"), 200)["queues"]}
    assert api_b.eph_pop(q, batch=10) == []
    msgs = api.eph_pop(q)
    assert api_b.eph_ack(q, _ids(msgs))[0] in ("stale", "unknown")
    assert api.eph_ack(q, _ids(msgs)) == ["acked"]


@contract("XB-EPH-WAKE")
def test_push_on_one_broker_wakes_a_waiting_pop_on_another(api, api_other):
    q = uniq("eph")
    assert api_other.eph_pop(q) == []
    _woken_by_a_push(api_other, api, q, "across")
