"""broker/streams and /streams/v1/*: query registration, the cycle (state + sink pushes + source ack,
all or nothing, replay-safe) and state reads, over HTTP against the shared broker; tenancy, grants and
the authentication of the /streams/ prefix on a broker of their own."""

from __future__ import annotations

import uuid

import pytest
from conftest import uniq
from helpers import authed, dedicated_broker, refused


def _leased(api, q: str, n: int, group: str = "g", partition: str = "p") -> dict:
    """Push ``n`` messages ({"i": i}) to ``q``/``partition`` and pop them all under one lease of ``group``."""
    assert api.push_n(q, n, partition).status_code == 201
    ans = api.pop(q, consumerGroup=group, batch=str(n))
    assert ans and len(ans["messages"]) == n and ans["leaseId"], ans
    return ans


def _ack_of(ans: dict, count: int | None = None) -> dict:
    msgs = ans["messages"]
    n = len(msgs) if count is None else count
    return {"transactionId": msgs[n - 1]["transactionId"], "leaseId": ans["leaseId"], "status": "completed", "count": n}


def _sink(q: str, partition: str = "p") -> list[dict]:
    return [{"queue": q, "partition": partition, "payload": {"sum": 1}}]


# ------------------------------------------------------------------------------ register

def test_register_is_idempotent_by_name_and_refuses_another_chain(api):
    name, src = uniq("sq"), uniq("src")
    first = api.stream_register(name, src, "h1", sink_queue=uniq("sink")).json()
    assert first["success"] is True and first["fresh"] is True and first["reset"] is False
    uuid.UUID(first["query_id"])
    again = api.stream_register(name, src, "h1").json()
    assert again["query_id"] == first["query_id"] and again["fresh"] is False and again["reset"] is False
    body = refused(api.stream_register(name, src, "h2"), 409, "config_hash_mismatch", "config_hash_mismatch")
    assert body["query_id"] == first["query_id"]
    # the refusal changed nothing: h1 still registers quietly
    assert api.stream_register(name, src, "h1").json()["reset"] is False


def test_reset_drops_the_state_only_when_the_chain_changed(api):
    name, src = uniq("sq"), uniq("src")
    qid = api.stream_query(name, src, "h1")
    pid = str(uuid.uuid4())
    r = api.cycle(qid, pid, state_ops=[{"type": "upsert", "key": "k", "value": 1}])
    assert r.status_code == 200 and r.json()["success"] is True, r.text
    same = api.stream_register(name, src, "h1", reset=True).json()
    assert same["reset"] is False and api.state(qid, pid) == {"k": 1}
    changed = api.stream_register(name, src, "h2", reset=True).json()
    assert changed["reset"] is True and changed["query_id"] == qid and changed["fresh"] is False
    assert api.state(qid, pid) == {}
    assert api.stream_register(name, src, "h2").json()["reset"] is False


@pytest.mark.parametrize("body, reason", [
    ({"source_queue": "s", "config_hash": "h"}, "bad_name"),
    ({"name": "n", "config_hash": "h"}, "bad_name"),
    ({"name": "n", "source_queue": "s"}, "bad_config_hash"),
    ({"name": "n", "source_queue": "s", "config_hash": "h", "reset": "yes"}, "bad_boolean"),
    ({"name": "n", "source_queue": "s", "config_hash": "h", "window": 5}, "unknown_field"),
])
def test_register_refuses_malformed_bodies(api, body, reason):
    refused(api.post("/streams/v1/queries", json=body), 400, "bad_request", reason)


# ------------------------------------------------------------------------------ cycle

def test_cycle_applies_state_pushes_the_sink_and_acks_the_batch(api):
    src, sink = uniq("src"), uniq("sink")
    qid = api.stream_query(uniq("sq"), src, sink_queue=sink)
    ans = _leased(api, src, 3)
    pid = ans["partitionId"]
    r = api.cycle(qid, pid, state_ops=[{"type": "upsert", "key": "count", "value": {"n": 3}}],
                  push_items=_sink(sink) * 2, ack=_ack_of(ans))
    body = r.json()
    assert r.status_code == 200 and body["success"] is True and body["duplicate"] is False, body
    assert body["state_ops_applied"] == 1 and body["ack_result"]["acked"] == 3
    assert [p["status"] for p in body["push_results"]] == ["queued", "queued"]
    assert api.state(qid, pid) == {"count": {"n": 3}}
    assert [m["data"] for m in api.messages(sink, batch="10")] == [{"sum": 1}, {"sum": 1}]
    # the batch is done for the group and its lease released: nothing comes back, new pushes flow
    assert api.pop(src, consumerGroup="g") is None
    api.push_n(src, 1, "p")
    assert len(api.messages(src, consumerGroup="g")) == 1


def test_cycle_with_a_wrong_lease_applies_nothing(api):
    src, sink = uniq("src"), uniq("sink")
    qid = api.stream_query(uniq("sq"), src, sink_queue=sink)
    ans = _leased(api, src, 2)
    pid = ans["partitionId"]
    bad = {**_ack_of(ans), "leaseId": str(uuid.uuid4())}
    r = api.cycle(qid, pid, state_ops=[{"type": "upsert", "key": "k", "value": 1}], push_items=_sink(sink), ack=bad)
    body = r.json()
    assert r.status_code == 200 and body["success"] is False and body["reason"] == "lease_invalid", body
    assert body["error"] == "Invalid or expired lease"
    assert api.state(qid, pid) == {}
    assert api.messages(sink) == []
    # the real lease still holds the batch, and still acks it
    assert api.cycle(qid, pid, ack=_ack_of(ans)).json()["success"] is True


@pytest.mark.parametrize("ack, reason", [
    (lambda a: {**_ack_of(a), "count": 3}, "ack_refused"),                      # more than the lease holds
    (lambda a: {**_ack_of(a), "transactionId": "nope"}, "ack_refused"),         # unknown message
    (lambda a: {**_ack_of(a, 2), "count": 1}, "ack_refused"),                   # txn beyond the first `count`
    (lambda a: {**_ack_of(a), "leaseId": "not-a-lease"}, "lease_invalid"),      # as the log: a refusal, not 400
])
def test_cycle_ack_refusals_write_nothing(api, ack, reason):
    src = uniq("src")
    qid = api.stream_query(uniq("sq"), src)
    ans = _leased(api, src, 2)
    pid = ans["partitionId"]
    body = api.cycle(qid, pid, state_ops=[{"type": "upsert", "key": "k", "value": 1}], ack=ack(ans)).json()
    assert body["success"] is False and body["reason"] == reason, body
    assert api.state(qid, pid) == {}
    assert api.cycle(qid, pid, ack=_ack_of(ans)).json()["ack_result"]["acked"] == 2


def test_a_replayed_cycle_is_applied_once(api):
    src, sink = uniq("src"), uniq("sink")
    qid = api.stream_query(uniq("sq"), src, sink_queue=sink)
    ans = _leased(api, src, 2)
    pid = ans["partitionId"]
    step = {"state_ops": [{"type": "upsert", "key": "k", "value": 1}], "push_items": _sink(sink), "ack": _ack_of(ans)}
    assert api.cycle(qid, pid, **step).json()["duplicate"] is False
    replay = api.cycle(qid, pid, **{**step, "state_ops": [{"type": "upsert", "key": "k", "value": 2}]}).json()
    assert replay["success"] is True and replay["duplicate"] is True and replay["push_results"] == [], replay
    assert api.state(qid, pid) == {"k": 1}
    assert len(api.messages(sink, batch="10")) == 1


async def test_the_same_cycle_sent_twice_at_once_is_applied_once(api, ahttp):
    """Two copies racing (a client retry overtaking its original): the steps of one (query, partition) are
    serialised, so one commits and the other finds the batch done."""
    import asyncio

    src, sink = uniq("src"), uniq("sink")
    qid = api.stream_query(uniq("sq"), src, sink_queue=sink)
    ans = _leased(api, src, 5)
    body = {"query_id": qid, "partition_id": ans["partitionId"], "consumer_group": "g",
            "state_ops": [{"type": "upsert", "key": "k", "value": 1}], "push_items": _sink(sink), "ack": _ack_of(ans)}
    answers = [r.json() for r in await asyncio.gather(*[ahttp.post("/streams/v1/cycle", json=body) for _ in range(4)])]
    assert all(a["success"] for a in answers), answers
    assert sorted(a["duplicate"] for a in answers) == [False, True, True, True]
    assert len(api.messages(sink, batch="10")) == 1


def test_partial_ack_with_release_delivers_the_tail_again_at_once(api):
    src = uniq("src")
    qid = api.stream_query(uniq("sq"), src)
    ans = _leased(api, src, 3)
    released = api.cycle(qid, ans["partitionId"], ack=_ack_of(ans, 1), release_lease=True).json()
    assert released["ack_result"]["acked"] == 1, released
    again = api.messages(src, consumerGroup="g", batch="10")
    assert [m["data"] for m in again] == [{"i": 1}, {"i": 2}]
    assert [m["deliveryAttempt"] for m in again] == [1, 1]  # released, not expired: no failure counted


def test_partial_ack_without_release_holds_the_partition_until_the_lease_ends(api):
    """The SDK's gate defers the tail of a batch: the partition stays held (a back-off), then the tail
    comes back without a failure counted, so deferring never walks messages to the DLQ."""
    src = uniq("src")
    api.configure(src, leaseTime=1, retryLimit=0)
    qid = api.stream_query(uniq("sq"), src)
    ans = _leased(api, src, 3)
    pid = ans["partitionId"]
    kept = api.cycle(qid, pid, ack=_ack_of(ans, 1), release_lease=False).json()
    assert kept["success"] is True and kept["ack_result"]["acked"] == 1, kept
    assert api.pop(src, consumerGroup="g") is None  # still held
    tail = {**_ack_of(ans, 2), "count": 1}
    assert api.cycle(qid, pid, ack=tail).json()["reason"] == "ack_refused"  # the lease no longer covers it
    again: list[dict] = []
    for _ in range(10):
        again = again or api.messages(src, consumerGroup="g", batch="10", wait="true", timeout="1000")
    assert [m["data"] for m in again] == [{"i": 1}, {"i": 2}]
    assert [m["deliveryAttempt"] for m in again] == [1, 1]
    assert api.get("/api/v1/dlq", params={"queue": src}).json()["total"] == 0


def test_a_framed_pops_partition_number_names_the_same_partition(api):
    """A client reading framed pops sends the partition back as its decimal number (docs/protocol.md §1.11)."""
    from broker.ids import partition_number

    src = uniq("src")
    qid = api.stream_query(uniq("sq"), src)
    ans = _leased(api, src, 2)
    number = partition_number(uuid.UUID(ans["partitionId"]))
    assert number is not None
    body = api.cycle(qid, str(number), state_ops=[{"type": "upsert", "key": "k", "value": 1}], ack=_ack_of(ans)).json()
    assert body["success"] is True and body["ack_result"]["acked"] == 2, body
    assert api.state(qid, ans["partitionId"]) == {"k": 1} == api.state(qid, str(number))


def test_flush_cycle_without_ack_applies_state_and_pushes(api):
    src, sink = uniq("src"), uniq("sink")
    qid = api.stream_query(uniq("sq"), src, sink_queue=sink)
    pid = str(uuid.uuid4())
    api.cycle(qid, pid, state_ops=[{"type": "upsert", "key": "w1", "value": 5}, {"type": "upsert", "key": "w2", "value": 6}])
    body = api.cycle(qid, pid, state_ops=[{"type": "delete", "key": "w1"}], push_items=_sink(sink)).json()
    assert body["success"] is True and body["ack_result"] is None, body
    assert api.state(qid, pid) == {"w2": 6}
    assert [m["data"] for m in api.messages(sink)] == [{"sum": 1}]


def test_state_ops_apply_in_order_last_op_on_a_key_wins(api):
    qid = api.stream_query(uniq("sq"), uniq("src"))
    pid = str(uuid.uuid4())
    ops = [{"type": "upsert", "key": "a", "value": 1}, {"type": "delete", "key": "a"},
           {"type": "delete", "key": "b"}, {"type": "upsert", "key": "b", "value": None},
           {"type": "upsert", "key": "c", "value": 1}, {"type": "upsert", "key": "c", "value": [2]}]
    assert api.cycle(qid, pid, state_ops=ops).json()["state_ops_applied"] == 6
    assert api.state(qid, pid) == {"b": None, "c": [2]}


def test_a_full_sink_refuses_the_whole_cycle(api):
    src, sink = uniq("src"), uniq("sink")
    api.configure(sink, maxSize=1)
    qid = api.stream_query(uniq("sq"), src, sink_queue=sink)
    ans = _leased(api, src, 2)
    pid = ans["partitionId"]
    body = api.cycle(qid, pid, state_ops=[{"type": "upsert", "key": "k", "value": 1}], push_items=_sink(sink) * 2,
                     ack=_ack_of(ans)).json()
    assert body["success"] is False and body["reason"] == "queue_full" and "maxSize" in body["error"], body
    assert api.state(qid, pid) == {}
    assert api.messages(sink) == []
    assert api.cycle(qid, pid, push_items=_sink(sink), ack=_ack_of(ans)).json()["success"] is True


def test_a_malformed_sink_item_refuses_the_whole_cycle(api):
    src = uniq("src")
    qid = api.stream_query(uniq("sq"), src)
    ans = _leased(api, src, 1)
    pid = ans["partitionId"]
    r = api.cycle(qid, pid, state_ops=[{"type": "upsert", "key": "k", "value": 1}],
                  push_items=[{"queue": "", "partition": "p", "payload": 1}], ack=_ack_of(ans))
    refused(r, 400, "bad_request", "bad_name")
    assert api.state(qid, pid) == {}
    assert api.cycle(qid, pid, ack=_ack_of(ans)).json()["ack_result"]["acked"] == 1


@pytest.mark.parametrize("patch, reason", [
    ({"query_id": "x"}, "bad_uuid"),
    ({"partition_id": None}, "bad_uuid"),
    ({"state_ops": [{"type": "merge", "key": "k"}]}, "bad_state_op_type"),
    ({"state_ops": [{"type": "upsert", "key": "k"}]}, "value_required"),
    ({"state_ops": [{"type": "delete", "key": ""}]}, "bad_state_key"),
    ({"state_ops": [{"type": "delete", "key": "\U0001f600" * 257}]}, "bad_state_key"),  # 1,028 bytes
    ({"state_ops": [{"type": "upsert", "key": "k", "value": {"s": "a\u0000b"}}]}, "bad_state_value"),
    ({"state_ops": [{"type": "delete", "key": "k", "value": 1}]}, "unknown_field"),
    ({"push_items": [{"queue": "q", "payload": 1, "messageId": "m"}]}, "server_owned_field"),
    ({"ack": {"transactionId": "t", "leaseId": "l", "status": "failed", "count": 1}}, "bad_ack_status"),
    ({"ack": {"transactionId": "t", "leaseId": "l", "count": 0}}, "bad_count"),
    ({"ack": {"transactionId": "t", "leaseId": "l", "count": 1, "extra": 1}}, "unknown_field"),
    ({"ack": [1]}, "bad_ack"),
    ({"release_lease": 1}, "bad_boolean"),
    ({"window": 1}, "unknown_field"),
])
def test_cycle_refuses_malformed_bodies(api, patch, reason):
    body = {"query_id": str(uuid.uuid4()), "partition_id": str(uuid.uuid4()), "consumer_group": "g",
            "state_ops": [], "push_items": [], "ack": None, **patch}
    refused(api.post("/streams/v1/cycle", json=body), 400, "bad_request", reason)


def test_unknown_query_is_404_on_cycle_and_state(api):
    qid, pid = str(uuid.uuid4()), str(uuid.uuid4())
    refused(api.cycle(qid, pid, state_ops=[{"type": "upsert", "key": "k", "value": 1}]), 404,
            "stream_query_not_found", "stream_query_not_found")
    refused(api.post("/streams/v1/state/get", json={"query_id": qid, "partition_id": pid, "keys": []}), 404,
            "stream_query_not_found")


# ------------------------------------------------------------------------------ state get

def test_state_get_by_keys_prefix_and_ripeness(api):
    qid = api.stream_query(uniq("sq"), uniq("src"))
    pid, other = str(uuid.uuid4()), str(uuid.uuid4())
    sep = "\u001f"
    ops = [{"type": "upsert", "key": f"tumb:1{sep}w1{sep}a", "value": {"acc": 1, "windowStart": 0, "windowEnd": 1000}},
           {"type": "upsert", "key": f"tumb:1{sep}w2{sep}a", "value": {"acc": 2, "windowStart": 1000, "windowEnd": 2000}},
           {"type": "upsert", "key": f"tumb:10{sep}w1{sep}a", "value": {"acc": 3, "windowEnd": 500}},
           {"type": "upsert", "key": "__wm__", "value": {"eventTimeMs": 1500}},
           {"type": "upsert", "key": f"tumb:1{sep}odd", "value": {"windowEnd": "soon"}}]
    api.cycle(qid, pid, state_ops=ops)
    api.cycle(qid, other, state_ops=[{"type": "upsert", "key": "__wm__", "value": 9}])
    assert len(api.state(qid, pid)) == 5 and api.state(qid, other) == {"__wm__": 9}
    assert api.state(qid, pid, ["__wm__", "missing"]) == {"__wm__": {"eventTimeMs": 1500}}
    assert sorted(api.state(qid, pid, key_prefix=f"tumb:1{sep}")) == [f"tumb:1{sep}odd", f"tumb:1{sep}w1{sep}a",
                                                                       f"tumb:1{sep}w2{sep}a"]
    ripe = api.state(qid, pid, key_prefix=f"tumb:1{sep}", ripe_at_or_before=1000)
    assert ripe == {f"tumb:1{sep}w1{sep}a": {"acc": 1, "windowStart": 0, "windowEnd": 1000}}
    assert sorted(api.state(qid, pid, ripe_at_or_before=2000)) == sorted([f"tumb:10{sep}w1{sep}a", f"tumb:1{sep}w1{sep}a",
                                                                           f"tumb:1{sep}w2{sep}a"])
    rows = api.post("/streams/v1/state/get", json={"query_id": qid, "partition_id": pid, "keys": ["__wm__"]}).json()
    assert rows["success"] is True and rows["rows"][0]["updated_at"].endswith("Z")


@pytest.mark.parametrize("patch, reason", [
    ({"keys": "k"}, "bad_keys"),
    ({"keys": [1]}, "bad_state_key"),
    ({"key_prefix": 5}, "bad_key_prefix"),
    ({"ripe_at_or_before": "1000"}, "bad_ripe_at_or_before"),
    ({"ripe_at_or_before": True}, "bad_ripe_at_or_before"),
    ({"limit": 5}, "unknown_field"),
])
def test_state_get_refuses_malformed_bodies(api, patch, reason):
    body = {"query_id": str(uuid.uuid4()), "partition_id": str(uuid.uuid4()), "keys": [], **patch}
    refused(api.post("/streams/v1/state/get", json=body), 400, "bad_request", reason)


# ------------------------------------------------------------------------------ tenancy, grants, auth

SECRET = "streams-test-secret"


@pytest.fixture(scope="module")
def auth_broker(pg, tmp_path_factory):
    env = {"QUEEN_JWT_SECRET": SECRET, "QUEEN_LIMITS_REFRESH_MS": "200"}
    with dedicated_broker(pg, tmp_path_factory, "streams-auth", env) as b:
        yield b


def test_streams_prefix_is_authenticated(auth_broker):
    import httpx

    with httpx.Client(base_url=auth_broker.url, timeout=10) as c:
        for path in ("/streams/v1/queries", "/streams/v1/cycle", "/streams/v1/state/get", "//streams/v1/cycle"):
            # absolute: a base_url client would eat the "//"
            refused(c.post(auth_broker.url + path, json={}), 401, "unauthenticated", "token_missing")


def test_another_tenants_query_does_not_exist(auth_broker):
    with authed(SECRET, auth_broker, "t-a") as a, authed(SECRET, auth_broker, "t-b") as b:
        name = uniq("sq")
        qid = a.stream_query(name, "src")
        pid = str(uuid.uuid4())
        a.cycle(qid, pid, state_ops=[{"type": "upsert", "key": "k", "value": 1}])
        refused(b.cycle(qid, pid, state_ops=[{"type": "upsert", "key": "k", "value": 2}]), 404, "stream_query_not_found")
        refused(b.post("/streams/v1/state/get", json={"query_id": qid, "partition_id": pid}), 404, "stream_query_not_found")
        # the same name is another query in another tenant
        assert b.stream_query(name, "src") != qid
        assert a.state(qid, pid) == {"k": 1}


def test_grants_consume_for_state_and_acks_produce_for_sinks(auth_broker):
    with authed(SECRET, auth_broker, "t-g", grants=["consume"]) as c, \
         authed(SECRET, auth_broker, "t-g", grants=["produce"]) as p:
        refused(c.stream_register(uniq("sq"), "src", sink_queue="out"), 403, "forbidden", "missing_grant")
        refused(p.stream_register(uniq("sq"), "src"), 403, "forbidden", "missing_grant")
        qid = c.stream_query(uniq("sq"), "src")
        pid = str(uuid.uuid4())
        refused(c.cycle(qid, pid, push_items=_sink("out")), 403, "forbidden", "missing_grant")
        refused(p.post("/streams/v1/state/get", json={"query_id": qid, "partition_id": pid}), 403, "forbidden")
        assert c.cycle(qid, pid, state_ops=[{"type": "upsert", "key": "k", "value": 1}]).json()["success"] is True


def test_sink_pushes_are_admitted_and_metered_like_pushes(auth_broker):
    import time

    with authed(SECRET, auth_broker, "ops", grants=("admin",)) as admin, authed(SECRET, auth_broker, "t-q") as c:
        assert admin.put("/api/v1/admin/tenants/t-q/plan", json={"periodQuotaMessages": 3}).status_code == 200
        time.sleep(0.4)  # past the limits cache's staleness bound
        qid = c.stream_query(uniq("sq"), "src", sink_queue="out")
        pid = str(uuid.uuid4())
        body = c.cycle(qid, pid, state_ops=[{"type": "upsert", "key": "k", "value": 1}], push_items=_sink("out") * 2).json()
        assert body["success"] is True and len(body["push_results"]) == 2, body
        assert c.get("/api/v1/usage").json()["messages"] == 2
        time.sleep(0.4)
        r = c.cycle(qid, pid, state_ops=[{"type": "upsert", "key": "k", "value": 2}], push_items=_sink("out") * 2)
        refused(r, 429, "quota_exceeded")
        assert c.state(qid, pid) == {"k": 1}
        assert len(c.messages("out", batch="10")) == 2


def test_the_longest_key_and_any_json_value_are_stored(api):
    qid = api.stream_query(uniq("sq"), uniq("src"))
    pid = str(uuid.uuid4())
    key = "é" * 512  # 1,024 bytes: the limit
    value = {"deep": [[[{"n": 1.5}]]], "s": "\U0001f600", "null": None, "big": 2**62}
    assert api.cycle(qid, pid, state_ops=[{"type": "upsert", "key": key, "value": value}]).json()["success"] is True
    assert api.state(qid, pid, [key]) == {key: value}
    assert api.state(qid, pid, key_prefix="é" * 300) == {key: value}
