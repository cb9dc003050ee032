"""A deployment, not just a process: several brokers on one database (README "Multiple brokers on one
database"). The calls of each test are spread over two brokers (``api`` on the first --url, ``api_other``
on the second); with one URL these contracts are NOT VERIFIED, with the reason.
"""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

import pytest

from conformance.client import expect, pushed, uniq

contract = pytest.mark.contract


def _push(api, q: str, payloads: list[Any], txns: list[str] | None = None) -> list[dict[str, Any]]:
    txns = txns or [uuid.uuid4().hex for _ in payloads]
    data = pushed(api.push_items([{"queue": q, "partition": "Default", "payload": p, "transactionId": t}
                                  for p, t in zip(payloads, txns, strict=True)]))
    assert len(data) == len(payloads), data
    return data


@contract("XB-PUSH-POP")
def test_push_on_one_pop_and_ack_on_another(api, api_other):
    q, t = uniq("q"), uuid.uuid4().hex
    first = _push(api, q, [{"n": 1}], txns=[t])[0]
    again = _push(api_other, q, [{"n": 2}], txns=[t])[0]
    assert again["status"] == "duplicate" and again["message_id"] == first["message_id"], (first, again)
    data = api_other.pop_leased(q, group="g")
    assert data is not None and [m["data"] for m in data["messages"]] == [{"n": 1}], data
    m = data["messages"][0]
    assert m["id"] == first["message_id"]
    assert api.ack(m, group="g")["success"] is True, "an ack on broker 1 under a lease taken on broker 2"
    assert api_other.pop_leased(q, group="g", wait=False) is None and api.pop_leased(q, group="g", wait=False) is None


@contract("XB-LEASE-SHARED")
def test_lease_holds_on_every_broker(api, api_other):
    q = uniq("q")
    _push(api, q, ["a", "b"])
    held = api.pop_leased(q, group="g", batch=1)
    assert held is not None and [m["data"] for m in held["messages"]] == ["a"]
    assert api_other.pop_leased(q, group="g", wait=False) is None, "broker 2 handed out a partition leased on broker 1"
    ext = expect(api_other.http.post(f"/api/v1/lease/{held['leaseId']}/extend"), 200)
    ext = ext[0] if isinstance(ext, list) else ext
    assert ext.get("success") is True, f"broker 2 does not know broker 1's lease: {ext}"
    assert api_other.ack(held["messages"][0], group="g")["success"] is True
    nxt = api_other.pop_leased(q, group="g")
    assert nxt is not None and [m["data"] for m in nxt["messages"]] == ["b"], nxt
    api.ack(nxt["messages"][0], group="g")


@contract("XB-LONG-POLL-WAKE")
def test_push_on_one_wakes_a_long_poll_on_another(api, api_other):
    q = uniq("q")
    _push(api, q, [0])
    api_other.drain(q)
    out: dict[str, Any] = {}

    def wait() -> None:
        t0 = time.monotonic()
        resp = api_other.pop_raw(q, batch=10, wait=True, timeout=10_000, autoAck=True, timeout_s=40)
        out["elapsed"], out["status"] = time.monotonic() - t0, resp.status_code
        out["data"] = [m["data"] for m in resp.json()["messages"]] if resp.status_code == 200 else []

    th = threading.Thread(target=wait, daemon=True)
    th.start()
    time.sleep(0.5)
    assert th.is_alive(), f"the long poll on broker 2 answered at once: {out}"
    t_push = time.monotonic()
    _push(api, q, [{"woke": "across"}])
    th.join(15)
    assert out.get("status") == 200 and out["data"] == [{"woke": "across"}], out
    waited = out["elapsed"] - 0.5
    assert waited < 3.0, (f"a push on broker 1 woke the poll on broker 2 only after {waited:.2f}s "
                          f"(timeout 10 s; {time.monotonic() - t_push:.2f}s after the push)")


@contract("XB-TIMER-CROSS")
def test_timer_scheduled_on_one_cancelled_on_another(api, api_other):
    q, k, txn = uniq("q"), uniq("k"), uuid.uuid4().hex
    r = api.schedule(q, k, delay_ms=600_000, txn=txn)
    assert r["ok"] is True
    peek = api_other.peek_ok(q, k)
    assert peek["found"] is True and peek["txn"] == txn, peek
    assert [row["timerKey"] for row in expect(api_other.list(q), 200)["rows"]] == [k]
    c = expect(api_other.cancel(q, k, txn=txn), 200)
    assert c["status"] == "cancelled" and c["ok"] is True, c
    assert api.peek_ok(q, k)["found"] is False, "cancelled on broker 2, still pending on broker 1"
    again = expect(api.cancel(q, k, txn=txn), 200)
    assert again["status"] == "absent", again


@contract("XB-TOO-LATE")
def test_claim_seen_as_too_late_from_another_broker(api, api_other, hooks):
    q, k, txn = uniq("q"), uniq("k"), uuid.uuid4().hex
    api.schedule(q, k, delay_ms=1000, txn=txn)
    hooks.hold(q, k, 1500)  # the claim is taken through broker 1
    try:
        assert api_other.peek_ok(q, k)["claimed"] is True, "broker 2 does not see broker 1's claim"
        c = expect(api_other.cancel(q, k, txn=txn), 200)
        assert c["status"] == "too_late" and c["ok"] is False, c
    finally:
        hooks.release(q)
    api_other.wait_delivered(q, txn)
