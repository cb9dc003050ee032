"""The rest of the official client's surface (docs/protocol.md §2.2, §2.7–§2.14, §5; docs/decisions.md §7):
the routes its admin API, consumer-group management, traces, reads by offset and locks call, as HTTP."""

from __future__ import annotations

import time
from urllib.parse import quote

import pytest

from conformance.client import expect, expect_error, uniq

contract = pytest.mark.contract


def _pop_leased(api, q: str, *, group: str | None = None, batch: int = 10) -> dict:
    params = {"batch": str(batch), "wait": "false"}
    if group:
        params["consumerGroup"] = group
    data = expect(api.http.get(f"/api/v1/pop/queue/{quote(q, safe='')}", params=params), 200)
    assert data.get("messages") and data.get("leaseId"), data
    return data


# ------------------------------------------------------------------------------ deviations (item 10)

@contract("CLI-DELETE-MISSING-QUEUE")
def test_delete_of_missing_queue_answers_deleted_false(admin):
    q = uniq("gone")
    data = expect(admin.api.http.delete(f"/api/v1/resources/queues/{q}"), 200)
    assert data.get("deleted") is False and not data.get("error"), data
    expect(admin.api.push(q, [1]), (200, 201))
    assert expect(admin.api.http.delete(f"/api/v1/resources/queues/{q}"), 200).get("deleted") is True
    assert expect(admin.api.http.delete(f"/api/v1/resources/queues/{q}"), 200).get("deleted") is False


@contract("CLI-RENEW-EXPIRED-LEASE")
def test_renewing_an_expired_lease_answers_false(api):
    q = uniq("lease")
    expect(api.configure(q, leaseTime=1), (200, 201))
    expect(api.push(q, ["x"]), (200, 201))
    lease = _pop_leased(api, q)["leaseId"]
    live = expect(api.http.post(f"/api/v1/lease/{lease}/extend"), 200)
    assert live.get("success") is True, live
    # The renewal pushed the end out: wait for a fresh short lease instead.
    q2 = uniq("lease")
    expect(api.configure(q2, leaseTime=1), (200, 201))
    expect(api.push(q2, ["y"]), (200, 201))
    lease2 = _pop_leased(api, q2)["leaseId"]
    time.sleep(1.5)
    dead = expect(api.http.post(f"/api/v1/lease/{lease2}/extend"), 200)
    assert dead.get("success") is False, dead
