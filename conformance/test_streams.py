"""The streams SDK's routes (docs/protocol.md §11), as HTTP: query registration, the cycle (state ops,
sink pushes and the source ack in one transaction) and state reads."""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest

from conformance.client import configured, expect, expect_error, pushed, uniq

contract = pytest.mark.contract

SEP = "\u001f"


def _register(api, name: str, source: str, config_hash: str = "h1", **extra: Any) -> Any:
    return api.http.post("/streams/v1/queries", json={"name": name, "source_queue": source,
                                                      "config_hash": config_hash, "reset": False, **extra})


def _query(api, source: str, **extra: Any) -> str:
    data = expect(_register(api, uniq("sq"), source, **extra), 200)
    assert data.get("success") is True and data.get("query_id"), data
    return data["query_id"]


def _cycle(api, query_id: str, partition_id: str, *, state_ops: list | None = None, push_items: list | None = None,
           ack: dict | None = None, group: str = "g", **extra: Any) -> dict:
    return expect(api.http.post("/streams/v1/cycle", json={
        "query_id": query_id, "partition_id": partition_id, "consumer_group": group, "state_ops": state_ops or [],
        "push_items": push_items or [], "ack": ack, **extra}), 200)


def _state(api, query_id: str, partition_id: str, **extra: Any) -> dict:
    data = expect(api.http.post("/streams/v1/state/get", json={"query_id": query_id, "partition_id": partition_id,
                                                                "keys": [], **extra}), 200)
    assert data.get("success", True) is True and isinstance(data.get("rows"), list), data
    return {r["key"]: r["value"] for r in data["rows"]}


def _batch(api, q: str, n: int, group: str = "g") -> dict:
    """``n`` messages ({"i": i}) pushed to one partition and popped under one lease of ``group``."""
    pushed(api.push(q, [{"i": i} for i in range(n)], partition="p"))
    data = api.pop_leased(q, group=group, batch=n)
    assert data and len(data["messages"]) == n and data.get("leaseId"), data
    return data


def _ack(batch: dict, n: int | None = None) -> dict:
    msgs = batch["messages"]
    n = len(msgs) if n is None else n
    return {"transactionId": msgs[n - 1]["transactionId"], "leaseId": batch["leaseId"], "status": "completed",
            "count": n}


def _sink(q: str) -> list[dict]:
    return [{"queue": q, "partition": "p", "payload": {"out": 1}}]


def _leased_query(api, n: int) -> tuple[str, str, str, dict, str]:
    """A query over a fresh source with a fresh sink, and a batch of ``n`` popped under one lease:
    (query id, source queue, sink queue, the pop answer, the batch's partition id)."""
    src, sink = uniq("src"), uniq("sink")
    qid = _query(api, src, sink_queue=sink)
    batch = _batch(api, src, n)
    return qid, src, sink, batch, batch["partitionId"]


@contract("STR-REGISTER")
def test_registration_by_name_and_config_hash(api):
    name, src = uniq("sq"), uniq("src")
    first = expect(_register(api, name, src), 200)
    assert first["fresh"] is True and first["reset"] is False and first["name"] == name, first
    again = expect(_register(api, name, src), 200)
    assert again["query_id"] == first["query_id"] and again["fresh"] is False, again
    pid = str(uuid.uuid4())
    _cycle(api, first["query_id"], pid, state_ops=[{"type": "upsert", "key": "k", "value": 1}])
    expect_error(_register(api, name, src, "h2"), 409, "config_hash_mismatch")
    assert _state(api, first["query_id"], pid) == {"k": 1}
    reset = expect(_register(api, name, src, "h2", reset=True), 200)
    assert reset["reset"] is True and reset["query_id"] == first["query_id"], reset
    assert _state(api, first["query_id"], pid) == {}


@contract("STR-CYCLE-COMMIT")
def test_a_cycle_commits_state_sink_and_ack_together(api):
    qid, src, sink, batch, pid = _leased_query(api, 3)
    out = _cycle(api, qid, pid, state_ops=[{"type": "upsert", "key": "n", "value": {"count": 3}}],
                 push_items=_sink(sink), ack=_ack(batch))
    assert out.get("success") is True, out
    assert _state(api, qid, pid) == {"n": {"count": 3}}
    assert [m["data"] for m in api.drain(sink)] == [{"out": 1}]
    assert api.pop_leased(src, group="g", wait=False) is None  # the batch is done for the group


@contract("STR-CYCLE-ALL-OR-NOTHING")
def test_a_cycle_refused_by_its_ack_applies_nothing(api):
    qid, src, sink, batch, pid = _leased_query(api, 2)
    wrong = {**_ack(batch), "leaseId": str(uuid.uuid4())}
    out = _cycle(api, qid, pid, state_ops=[{"type": "upsert", "key": "k", "value": 1}], push_items=_sink(sink),
                 ack=wrong)
    assert out.get("success") is False and out.get("reason") == "lease_invalid", out
    assert _state(api, qid, pid) == {}
    assert api.drain(sink) == []
    assert api.pop_leased(src, group="g", wait=False) is None  # still leased to the real lease, which still acks it
    assert _cycle(api, qid, pid, ack=_ack(batch)).get("success") is True


@contract("STR-CYCLE-REPLAY")
def test_a_resent_cycle_is_applied_once(api):
    qid, src, sink, batch, pid = _leased_query(api, 2)
    first = _cycle(api, qid, pid, state_ops=[{"type": "upsert", "key": "k", "value": 1}], push_items=_sink(sink),
                   ack=_ack(batch))
    assert first.get("success") is True and first.get("duplicate") is False, first
    again = _cycle(api, qid, pid, state_ops=[{"type": "upsert", "key": "k", "value": 2}], push_items=_sink(sink),
                   ack=_ack(batch))
    assert again.get("success") is True and again.get("duplicate") is True, again
    assert _state(api, qid, pid) == {"k": 1}
    assert len(api.drain(sink)) == 1


@contract("STR-CYCLE-PARTIAL-ACK")
def test_a_partial_ack_releases_or_holds_the_tail(api):
    src = uniq("src")
    configured(api.configure(src, leaseTime=1, retryLimit=0))
    qid = _query(api, src)
    batch = _batch(api, src, 3)
    pid = batch["partitionId"]
    assert _cycle(api, qid, pid, ack=_ack(batch, 1), release_lease=True).get("success") is True
    tail = api.pop_leased(src, group="g")
    assert tail and [m["data"] for m in tail["messages"]] == [{"i": 1}, {"i": 2}], tail
    assert _cycle(api, qid, pid, ack=_ack(tail, 1), release_lease=False).get("success") is True
    assert api.pop_leased(src, group="g", wait=False) is None  # held until the lease ends
    deadline = time.monotonic() + 10
    back = None
    while back is None and time.monotonic() < deadline:
        time.sleep(0.2)
        back = api.pop_leased(src, group="g")
    assert back and [m["data"] for m in back["messages"]] == [{"i": 2}], back
    assert [m.get("deliveryAttempt") for m in back["messages"]] == [1], back  # no failure counted
    assert api.dlq(src) == []


@contract("STR-STATE-GET")
def test_state_reads_by_keys_prefix_and_ripeness(api):
    qid = _query(api, uniq("src"))
    pid = str(uuid.uuid4())
    ops = [{"type": "upsert", "key": f"w{SEP}1{SEP}a", "value": {"acc": 1, "windowEnd": 1000}},
           {"type": "upsert", "key": f"w{SEP}2{SEP}a", "value": {"acc": 2, "windowEnd": 2000}},
           {"type": "upsert", "key": "__wm__", "value": {"eventTimeMs": 1500}},
           {"type": "upsert", "key": "gone", "value": 0}, {"type": "delete", "key": "gone"}]
    _cycle(api, qid, pid, state_ops=ops)
    assert sorted(_state(api, qid, pid)) == sorted([f"w{SEP}1{SEP}a", f"w{SEP}2{SEP}a", "__wm__"])
    assert _state(api, qid, pid, keys=["__wm__", "nope"]) == {"__wm__": {"eventTimeMs": 1500}}
    assert sorted(_state(api, qid, pid, key_prefix=f"w{SEP}")) == sorted([f"w{SEP}1{SEP}a", f"w{SEP}2{SEP}a"])
    assert _state(api, qid, pid, key_prefix=f"w{SEP}", ripe_at_or_before=1500) == {
        f"w{SEP}1{SEP}a": {"acc": 1, "windowEnd": 1000}}
    assert _state(api, qid, str(uuid.uuid4())) == {}  # state is per partition


@contract("STR-UNKNOWN-QUERY")
def test_an_unknown_query_is_404(api):
    qid, pid = str(uuid.uuid4()), str(uuid.uuid4())
    expect_error(api.http.post("/streams/v1/cycle", json={"query_id": qid, "partition_id": pid, "state_ops": [],
                                                         "push_items": [], "ack": None}), 404, "stream_query_not_found")
    expect_error(api.http.post("/streams/v1/state/get", json={"query_id": qid, "partition_id": pid, "keys": []}),
                 404, "stream_query_not_found")


@contract("STR-TENANCY")
def test_another_tenants_query_does_not_exist(api, api_b):
    qid = _query(api, uniq("src"))
    pid = str(uuid.uuid4())
    _cycle(api, qid, pid, state_ops=[{"type": "upsert", "key": "k", "value": 1}])
    expect_error(api_b.http.post("/streams/v1/state/get", json={"query_id": qid, "partition_id": pid, "keys": []}),
                 404, "stream_query_not_found")
    expect_error(api_b.http.post("/streams/v1/cycle", json={"query_id": qid, "partition_id": pid,
                                                           "state_ops": [{"type": "delete", "key": "k"}]}),
                 404, "stream_query_not_found")
    assert _state(api, qid, pid) == {"k": 1}


@contract("STR-MALFORMED")
def test_malformed_bodies_are_400_and_change_nothing(api):
    qid = _query(api, uniq("src"))
    pid = str(uuid.uuid4())
    for body in ({"name": "n", "config_hash": "h"}, {"name": "n", "source_queue": "s", "config_hash": "h", "x": 1}):
        expect_error(api.http.post("/streams/v1/queries", json=body), 400)
    for patch in ({"query_id": "nope"}, {"state_ops": [{"type": "merge", "key": "k"}]},
                  {"state_ops": [{"type": "upsert", "key": "k"}]},
                  {"ack": {"transactionId": "t", "leaseId": str(uuid.uuid4()), "status": "failed", "count": 1}},
                  {"release_lease": "no"}):
        body = {"query_id": qid, "partition_id": pid, "state_ops": [{"type": "upsert", "key": "k", "value": 1}],
                "push_items": [], "ack": None, **patch}
        expect_error(api.http.post("/streams/v1/cycle", json=body), 400)
    expect_error(api.http.post("/streams/v1/state/get", json={"query_id": qid, "partition_id": pid,
                                                              "ripe_at_or_before": "soon"}), 400)
    assert _state(api, qid, pid) == {}
