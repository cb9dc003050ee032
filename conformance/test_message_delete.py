"""Deleting one message (the official client's ``admin.delete_message``, docs/protocol.md §2.9,
docs/decisions.md §9): ``DELETE /api/v1/messages/{partitionId}/{transactionId}`` with the ``admin`` grant.
The message's payload goes; its offset stays as a tombstone that every consumer group passes over."""

from __future__ import annotations

import base64
import os
import uuid
from typing import Any

import pytest

from conformance.client import Api, expect, expect_error, not_verified, poll, uniq

contract = pytest.mark.contract


def _path(m: dict[str, Any]) -> str:
    return f"/api/v1/messages/{m['partitionId']}/{m['transactionId']}"


def _listed(api: Api, q: str) -> list[dict[str, Any]]:
    """The queue's messages, oldest first (the listing is newest first)."""
    return list(reversed(expect(api.http.get("/api/v1/messages", params={"queue": q}), 200)["messages"]))


@contract("CLI-MSG-DELETE")
def test_delete_answers_and_lookups_say_deleted(admin):
    api = admin.api
    q = uniq("del")
    expect(api.push(q, ["a", {"secret": "b"}, "c"]), (200, 201))
    first, target, last = _listed(api, q)
    got = expect(api.http.delete(_path(target)), 200)
    assert got["deleted"] is True and got["alreadyDeleted"] is False, got
    assert got["partitionId"] == target["partitionId"] and got["transactionId"] == target["transactionId"], got
    assert got["offset"] == target["offset"] and got["queue"] == q and isinstance(got["deletedAt"], str), got
    # the lookup by address answers the tombstone: 200, deleted, no data, its offset kept
    one = expect(api.http.get(_path(target)), 200)
    assert one["deleted"] is True and one["data"] is None and one["offset"] == target["offset"], one
    assert one["deletedAt"] == got["deletedAt"], one
    # the lookup by transaction id finds it, deleted
    found = api.lookup(q, target["transactionId"])
    assert found["found"] is True and found["deleted"] is True, found
    # the listing shows it in place, status deleted, and can filter on that status
    listed = _listed(api, q)
    assert [(m["transactionId"], m["status"]) for m in listed] == [
        (first["transactionId"], "pending"), (target["transactionId"], "deleted"), (last["transactionId"], "pending")]
    assert listed[1]["data"] is None, listed[1]
    only = expect(api.http.get("/api/v1/messages", params={"queue": q, "status": "deleted"}), 200)["messages"]
    assert [m["transactionId"] for m in only] == [target["transactionId"]], only
    # the neighbours are untouched
    assert expect(api.http.get(_path(first)), 200)["data"] == "a"
    assert expect(api.http.get(_path(last)), 200)["deleted"] is False


@contract("CLI-MSG-DELETE-PASSED-OVER")
def test_no_group_receives_a_deleted_message(admin):
    api = admin.api
    q = uniq("del-skip")
    expect(api.push(q, [0, 1, 2, 3]), (200, 201))
    listed = _listed(api, q)
    expect(api.http.delete(_path(listed[0])), 200)  # the head
    expect(api.http.delete(_path(listed[2])), 200)  # one in the middle
    # queue mode: the others, in offset order, and nothing more
    assert [m["data"] for m in api.drain(q)] == [1, 3]
    # a consumer group that starts after the deletion passes over them too
    group = uniq("g")
    seen: list[Any] = []
    while (ans := api.pop_leased(q, group=group, batch=1)) is not None and ans["messages"]:
        [m] = ans["messages"]
        seen.append(m["data"])
        assert api.ack(m, group=group)["success"] is True
    assert seen == [1, 3], seen
    # the offsets stay gapless: a message pushed now takes the next offset
    expect(api.push(q, [4]), (200, 201))
    assert [m["offset"] for m in _listed(api, q)] == [listed[0]["offset"] + i for i in range(5)]


@contract("CLI-MSG-DELETE-LEASE")
def test_a_lease_holding_a_deleted_message_acks_the_rest(admin):
    api = admin.api
    q = uniq("del-lease")
    expect(api.push(q, ["a", "b", "c"]), (200, 201))
    ans = api.pop_leased(q, batch=3)
    assert ans is not None and [m["data"] for m in ans["messages"]] == ["a", "b", "c"], ans
    a, b, c = ans["messages"]
    expect(api.http.delete(_path(b)), 200)
    assert api.ack(a)["success"] is True
    assert api.ack(c)["success"] is True
    # acking the deleted one under the lease is harmless: it is already done
    assert api.ack(b)["success"] is True
    # the lease is gone and the partition is free: the next message is delivered at once
    expect(api.push(q, ["d"]), (200, 201))
    nxt = api.pop_leased(q, batch=10)
    assert nxt is not None and [m["data"] for m in nxt["messages"]] == ["d"], nxt


@contract("CLI-MSG-DELETE-IDEMPOTENT")
def test_deleting_twice_answers_the_first_deletion(admin):
    api = admin.api
    q = uniq("del-twice")
    expect(api.push(q, ["x"]), (200, 201))
    [m] = _listed(api, q)
    first = expect(api.http.delete(_path(m)), 200)
    again = expect(api.http.delete(_path(m)), 200)
    assert again["deleted"] is True and again["alreadyDeleted"] is True, again
    assert again["deletedAt"] == first["deletedAt"] and again["offset"] == first["offset"], again


@contract("CLI-MSG-DELETE-NOT-FOUND")
def test_deleting_a_missing_message_is_404_in_the_envelope(admin):
    q = uniq("del-missing")
    expect(admin.api.push(q, ["x"]), (200, 201))
    [m] = _listed(admin.api, q)
    expect_error(admin.api.http.delete(f"/api/v1/messages/{m['partitionId']}/{uuid.uuid4().hex}"), 404,
                 "message_not_found")
    expect_error(admin.api.http.delete(f"/api/v1/messages/{uuid.uuid4()}/{m['transactionId']}"), 404,
                 "message_not_found")
    expect_error(admin.api.http.delete(f"/api/v1/messages/not-a-partition/{m['transactionId']}"), 400)
    assert expect(admin.api.http.get(_path(m)), 200)["data"] == "x"


@contract("CLI-MSG-DELETE-TENANT")
def test_another_tenants_message_cannot_be_deleted(admin, api_b):
    if admin.api.tenant is not None and admin.api.tenant == api_b.tenant:
        not_verified("the operator credential and --queen-token-b name the same tenant")
    q = uniq("del-tenant")
    expect(api_b.push(q, ["theirs"]), (200, 201))
    [m] = _listed(api_b, q)
    expect_error(admin.api.http.delete(_path(m)), 404, "message_not_found")
    assert expect(api_b.http.get(_path(m)), 200)["data"] == "theirs"
    assert [x["data"] for x in api_b.drain(q)] == ["theirs"]


@contract("CLI-MSG-DELETE-STORAGE")
def test_deleting_frees_its_storage(admin):
    api = admin.api
    q = uniq("del-bytes")
    blob = base64.b64encode(os.urandom(30_000)).decode()  # random: it stays large if the target compresses
    expect(api.push(q, [blob]), (200, 201))
    [m] = _listed(api, q)
    before = api.usage()["storageBytes"]
    got = expect(api.http.delete(_path(m)), 200)
    assert got["freedBytes"] >= 20_000, got
    # the gauge is shared with the tenant's other traffic: wait for the drop this deletion makes
    poll(lambda: api.usage()["storageBytes"] <= before - 20_000, timeout=10, what="the storage gauge to drop")
