"""The rest of the official client's surface (docs/protocol.md §2.2, §2.7–§2.14, §5; docs/decisions.md §7):
the routes its admin API, consumer-group management, traces, reads by offset and locks call, as HTTP."""

from __future__ import annotations

import time
from urllib.parse import quote

import pytest

from conformance.client import OK, SETTLE_MS, configured, expect, expect_error, pushed, uniq

contract = pytest.mark.contract


def _pop_leased(api, q: str, *, group: str | None = None, batch: int = 10) -> dict:
    params = {"batch": str(batch), "wait": "true", "timeout": str(SETTLE_MS)}
    if group:
        params["consumerGroup"] = group
    data = expect(api.http.get(f"/api/v1/pop/queue/{quote(q, safe='')}", params=params), 200)
    assert data.get("messages") and data.get("leaseId"), data
    return data


# ------------------------------------------------------------------------------ deviations (item 10)

@contract("CLI-DELETE-MISSING-QUEUE")
def test_delete_of_missing_queue_answers_deleted_false(operator):
    q = uniq("gone")
    # the client takes any 2xx without an error as success (docs/protocol.md §2.2): a missing queue's
    # deleted flag is the broker's to choose (ours says false, the C++ Queen true with existed: false)
    data = expect(operator.http.delete(f"/api/v1/resources/queues/{q}"), OK)
    assert isinstance(data, dict) and not data.get("error"), data
    pushed(operator.push(q, [1]))
    assert expect(operator.http.delete(f"/api/v1/resources/queues/{q}"), OK).get("deleted") is True
    again = expect(operator.http.delete(f"/api/v1/resources/queues/{q}"), OK)
    assert isinstance(again, dict) and not again.get("error"), again
    assert operator.pop(q, wait_ms=0) == [], "a deleted queue still hands out its message"


@contract("CLI-RENEW-EXPIRED-LEASE")
def test_renewing_an_expired_lease_answers_false(api):
    q = uniq("lease")
    configured(api.configure(q, leaseTime=1))
    pushed(api.push(q, ["x"]))
    lease = _pop_leased(api, q)["leaseId"]
    live = expect(api.http.post(f"/api/v1/lease/{lease}/extend"), 200)
    assert live.get("success") is True, live
    # The renewal pushed the end out: wait for a fresh short lease instead.
    q2 = uniq("lease")
    configured(api.configure(q2, leaseTime=1))
    pushed(api.push(q2, ["y"]))
    lease2 = _pop_leased(api, q2)["leaseId"]
    time.sleep(1.5)
    dead = expect(api.http.post(f"/api/v1/lease/{lease2}/extend"), 200)
    assert dead.get("success") is False, dead


# ------------------------------------------------------------------------------ DLQ replay by address (item 4)

def _dead_letter(api, q: str, payload) -> dict:
    configured(api.configure(q, retryLimit=0))
    pushed(api.push(q, [payload]))
    data = _pop_leased(api, q, batch=1)
    m = data["messages"][0]
    acked = expect(api.http.post("/api/v1/ack", json={
        "transactionId": m["transactionId"], "partitionId": m["partitionId"], "leaseId": data["leaseId"],
        "status": "failed", "error": "boom"}), 200)
    assert (acked[0] if isinstance(acked, list) else acked).get("success") is True, acked
    assert [r.get("transactionId") for r in api.dlq(q)] == [m["transactionId"]]
    return m


@contract("CLI-RETRY-MESSAGE")
def test_retry_by_address_replays_the_dead_letter(api):
    q = uniq("retry")
    m = _dead_letter(api, q, {"n": 1})
    path = f"/api/v1/messages/{m['partitionId']}/{m['transactionId']}/retry"
    out = expect(api.http.post(path), 200)
    assert out.get("replayed") is True, out
    assert api.dlq(q) == []
    got = api.pop(q)
    assert [g["data"] for g in got] == [{"n": 1}], got
    expect_error(api.http.post(path), 404, "dlq_not_found")


@contract("CLI-RETRY-SYNTHETIC-REFUSED")
def test_retry_by_address_refuses_a_timer_dead_letter(api, hooks):
    q, k, txn = uniq("retry-t"), uniq("k"), uniq("txn")
    pushed(api.push(q, ["partition exists"]))
    rows = hooks.dead_letter_timer(q, k, txn)
    pid = rows[0].get("partitionId")
    assert pid, rows[0]
    expect_error(api.http.post(f"/api/v1/messages/{pid}/{txn}/retry"), 409, "dlq_replay_refused",
                 "synthetic_consumer_group")
    assert [m.get("transactionId") for m in api.dlq(q)].count(txn) == 1


# ------------------------------------------------------------------------------ consumer groups (item 2)

CG = "/api/v1/consumer-groups"


def _iso_now() -> str:
    from datetime import UTC, datetime

    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


def _group_pop(api, q: str, g: str, partition: str | None = None) -> list:
    path = f"/api/v1/pop/queue/{quote(q, safe='')}" + (f"/partition/{quote(partition, safe='')}" if partition else "")
    resp = api.http.get(path, params={"consumerGroup": g, "batch": "50", "wait": "false"})
    if resp.status_code == 204:
        return []
    return [m["data"] for m in expect(resp, 200).get("messages") or []]


def _ack_group(api, q: str, g: str) -> None:
    resp = api.http.get(f"/api/v1/pop/queue/{quote(q, safe='')}", params={"consumerGroup": g, "batch": "50",
                                                                        "partitions": "100", "wait": "false",
                                                                        "autoAck": "true"})
    expect(resp, (200, 204))


@contract("CLI-GROUPS-LIST-LAG")
def test_groups_list_get_and_lagging(api, api_b):
    q, g = uniq("cg"), uniq("g")
    pushed(api.push(q, [1, 2, 3]))
    assert _group_pop(api, q, g) == [1, 2, 3]  # leased, not acked: all three pending
    listing = expect(api.http.get(CG), 200)
    mine = [x for x in listing["consumerGroups"] if x["name"] == g]
    assert mine and mine[0]["pending"] == 3 and mine[0]["queues"][0]["queue"] == q, listing
    one = expect(api.http.get(f"{CG}/{g}"), 200)
    assert one["pending"] == 3, one
    time.sleep(1.1)
    lag = expect(api.http.get(f"{CG}/lagging", params={"minLagSeconds": "1"}), 200)
    assert any(r["consumerGroup"] == g and r["lagSeconds"] >= 1 for r in lag["lagging"]), lag
    lag = expect(api.http.get(f"{CG}/lagging", params={"minLagSeconds": "3600"}), 200)
    assert not any(r["consumerGroup"] == g for r in lag["lagging"]), lag
    # another tenant sees none of it
    assert not [x for x in expect(api_b.http.get(CG), 200)["consumerGroups"] if x["name"] == g]
    expect_error(api_b.http.get(f"{CG}/{g}"), 404, "consumer_group_not_found")


@contract("CLI-GROUPS-SEEK")
def test_groups_seek_to_end_and_timestamp(api):
    q, g = uniq("cg-seek"), uniq("g")
    pushed(api.push(q, ["old"]))
    time.sleep(0.3)
    middle = _iso_now()
    time.sleep(0.3)
    pushed(api.push(q, ["new"]))
    expect(api.http.post(f"{CG}/{g}/queues/{q}/seek", json={"toEnd": True}), 200)
    assert _group_pop(api, q, g) == []
    expect(api.http.post(f"{CG}/{g}/queues/{q}/seek", json={"timestamp": middle}), 200)
    assert _group_pop(api, q, g) == ["new"]
    expect(api.http.post(f"{CG}/{g}/queues/{q}/seek", json={"timestamp": "2000-01-01T00:00:00Z"}), 200)
    assert _group_pop(api, q, g) == ["old", "new"]
    expect_error(api.http.post(f"{CG}/{g}/queues/{q}/seek", json={"toEnd": True, "timestamp": middle}), 400)
    expect_error(api.http.post(f"{CG}/{g}/queues/{uniq('none')}/seek", json={"toEnd": True}), 404)


@contract("CLI-GROUPS-DELETE")
def test_groups_delete_for_one_queue_and_everywhere(api):
    q1, q2, g = uniq("cg-del"), uniq("cg-del"), uniq("g")
    for q in (q1, q2):
        pushed(api.push(q, [q]))
        _ack_group(api, q, g)
        assert _group_pop(api, q, g) == []
    out = expect(api.http.delete(f"{CG}/{g}/queues/{q1}", params={"deleteMetadata": "true"}), 200)
    assert out.get("deleted") is True, out
    assert _group_pop(api, q1, g) == [q1]
    assert _group_pop(api, q2, g) == []
    expect(api.http.delete(f"{CG}/{g}", params={"deleteMetadata": "true"}), 200)
    assert not [x for x in expect(api.http.get(CG), 200)["consumerGroups"] if x["name"] == g]


@contract("CLI-GROUPS-SUBSCRIPTION")
def test_groups_subscription_timestamp(api):
    q, g = uniq("cg-sub"), uniq("g")
    pushed(api.push(q, ["p1"], partition="p1"))
    assert _group_pop(api, q, g, "p1") == ["p1"]
    pushed(api.push(q, ["before"], partition="p2"))
    time.sleep(0.3)
    at = _iso_now()
    time.sleep(0.3)
    expect(api.http.post(f"{CG}/{g}/subscription", json={"subscriptionTimestamp": at}), 200)
    pushed(api.push(q, ["after"], partition="p2"))
    assert _group_pop(api, q, g, "p2") == ["after"]


# ------------------------------------------------------------------------------ queue options (decisions §7)

def _data(msgs: list[dict]) -> list:
    return [m["data"] for m in msgs]


@contract("CLI-OPT-DELAYED")
def test_delayed_processing_holds_messages_until_due(api):
    q = uniq("opt-delay")
    configured(api.configure(q, delayedProcessing=1))
    pushed(api.push(q, ["later"]))
    assert api.pop(q, wait_ms=0) == []
    time.sleep(1.3)
    assert _data(api.pop(q)) == ["later"]


@contract("CLI-OPT-RETRY-DELAY")
def test_retry_delay_keeps_a_nacked_message_back(api):
    q = uniq("opt-retry")
    configured(api.configure(q, retryDelay=1000))
    pushed(api.push(q, ["flaky"]))
    [m] = api.pop_leased(q)["messages"]
    assert api.ack(m, status="failed", error="later")["success"] is True
    assert api.pop_leased(q, wait=False) is None
    time.sleep(1.3)
    [again] = api.pop_leased(q)["messages"]
    assert again["data"] == "flaky" and again["deliveryAttempt"] == 2, again


@contract("CLI-OPT-WINDOW")
def test_window_buffer_waits_for_a_quiet_partition(api):
    q = uniq("opt-window")
    configured(api.configure(q, windowBuffer=1))
    pushed(api.push(q, ["a", "b"]))
    assert api.pop(q, wait_ms=0) == []
    time.sleep(1.3)
    assert _data(api.pop(q)) == ["a", "b"]


@contract("CLI-OPT-MAX-WAIT")
def test_max_wait_dead_letters_what_waited_too_long(api):
    q = uniq("opt-wait")
    configured(api.configure(q, maxWaitTimeSeconds=1))
    pushed(api.push(q, ["stale"]))
    time.sleep(1.3)
    assert api.pop(q, wait_ms=0) == []
    [row] = api.dlq(q)
    assert row["data"] == "stale" and "max_wait_exceeded" in (row.get("errorMessage") or ""), row


@contract("CLI-OPT-PRIORITY")
def test_priority_orders_a_namespace_pop(api):
    ns = uniq("opt-ns")
    low, high = f"{ns}-a", f"{ns}-b"
    for q, prio in ((low, 1), (high, 5)):
        configured(api.http.post("/api/v1/configure", json={"queue": q, "namespace": ns, "task": None,
                                                            "options": {"priority": prio}}))
        pushed(api.push(q, [q]))
    got = []
    for _ in range(2):
        data = expect(api.http.get("/api/v1/pop", params={"namespace": ns, "batch": "1", "wait": "false",
                                                          "autoAck": "true"}), 200)
        got += _data(data["messages"])
    assert got == [high, low]


@contract("CLI-OPT-MAX-SIZE")
def test_max_size_refuses_the_push_that_would_exceed_it(api):
    q = uniq("opt-max")
    configured(api.configure(q, maxSize=1))
    assert pushed(api.push(q, [1]))[0]["status"] == "queued"
    [refused] = expect(api.push(q, [2]), OK)
    assert refused["status"] == "failed" and refused["reason"] == "queue_full", refused
    assert "queue_full" in refused["error"], refused
    assert _data(api.pop(q)) == [1]  # the refused push wrote nothing; consuming makes room
    assert pushed(api.push(q, [3]))[0]["status"] == "queued"


@contract("CLI-OPT-CONFLICT")
def test_a_delay_the_max_wait_forbids_is_refused(api):
    q = uniq("opt-conflict")
    data = expect_error(api.configure(q, delayedProcessing=2, maxWaitTimeSeconds=2), 400, reason="conflicting_options")
    assert "maxWaitTimeSeconds" in data["detail"], data
    configured(api.configure(q, delayedProcessing=1, maxWaitTimeSeconds=2))


# ------------------------------------------------------------------------------ monitoring (item 3)

@contract("CLI-MON-RESOURCES")
def test_overview_namespaces_tasks_partitions(api, api_b):
    ns, task, q = uniq("ns"), uniq("task"), uniq("mon")
    configured(api.http.post("/api/v1/configure", json={"queue": q, "namespace": ns, "task": task, "options": {}}))
    pushed(api.push(q, [1, 2], partition="a"))
    pushed(api.push(q, [3], partition="b"))
    ov = expect(api.http.get("/api/v1/resources/overview"), 200)
    assert ov["queues"] >= 1 and ov["messages"] >= 3, ov
    nss = expect(api.http.get("/api/v1/resources/namespaces"), 200)["namespaces"]
    assert [(n["queues"], n["messages"]) for n in nss if n["namespace"] == ns] == [(1, 3)], nss
    tks = expect(api.http.get("/api/v1/resources/tasks"), 200)["tasks"]
    assert [t["partitions"] for t in tks if t["task"] == task] == [2], tks
    parts = expect(api.http.get("/api/v1/resources/partitions", params={"queue": q}), 200)["partitions"]
    assert [(p["name"], p["messages"]) for p in parts] == [("a", 2), ("b", 1)], parts
    assert not [n for n in expect(api_b.http.get("/api/v1/resources/namespaces"), 200)["namespaces"]
                if n["namespace"] == ns]
    assert expect(api_b.http.get("/api/v1/resources/partitions", params={"queue": q}), 200)["partitions"] == []


@contract("CLI-MON-DEPTH")
def test_queue_depth(api):
    q, g = uniq("depth"), uniq("g")
    pushed(api.push(q, [1, 2, 3], partition="a"))
    pushed(api.push(q, [4], partition="b"))
    d = expect(api.http.get(f"/api/v1/resources/queues/{q}/depth"), 200)
    assert d["pending"] == 4 and d["partitionsPending"] == 2 and d["effectivePending"] == 4, d
    assert d["conflation"] is False
    _ack_group(api, q, g)
    d = expect(api.http.get(f"/api/v1/resources/queues/{q}/depth", params={"group": g}), 200)
    assert d["pending"] == 0 and d["group"] == g, d
    expect_error(api.http.get(f"/api/v1/resources/queues/{uniq('none')}/depth"), 404)


@contract("CLI-MON-STATUS")
def test_status_and_queue_stats(api, admin):
    q = uniq("stat")
    configured(api.configure(q, retryLimit=0))
    pushed(api.push(q, [1, 2]))
    _dead = _pop_leased(api, q, batch=1)
    m = _dead["messages"][0]
    expect(api.http.post("/api/v1/ack", json={"transactionId": m["transactionId"], "partitionId": m["partitionId"],
                                              "leaseId": _dead["leaseId"], "status": "failed"}), 200)
    st = expect(api.http.get("/api/v1/status"), 200)
    assert st["deadLetters"] >= 1, st
    rows = [r for r in expect(api.http.get("/api/v1/status/queues", params={"limit": "10000"}), 200)["queues"]
            if r["name"] == q]
    assert rows and rows[0]["messages"] == 2 and rows[0]["deadLetters"] == 1, rows
    assert expect(api.http.get(f"/api/v1/status/queues/{q}"), 200)["deadLetters"] == 1
    an = expect(api.http.get("/api/v1/status/analytics"), 200)
    assert isinstance(an.get("periods"), list), an
    assert expect(admin.api.http.get("/api/v1/analytics/system-metrics"), 200)["database"]["connections"] >= 1
    if api.token:  # with authentication off there is no grant to lack
        expect_error(api.http.get("/api/v1/analytics/system-metrics"), 403)


@contract("CLI-MON-MESSAGES")
def test_list_messages_and_delete_needs_admin(api):
    q = uniq("list")
    pushed(api.push(q, [0, 1, 2]))
    assert [m["data"] for m in api.pop(q, batch=1)] == [0]
    msgs = expect(api.http.get("/api/v1/messages", params={"queue": q}), 200)["messages"]
    assert [(m["data"], m["status"]) for m in msgs] == [(2, "pending"), (1, "pending"), (0, "completed")], msgs
    pend = expect(api.http.get("/api/v1/messages", params={"queue": q, "status": "completed"}), 200)["messages"]
    assert [m["data"] for m in pend] == [0]
    expect_error(api.http.get("/api/v1/messages"), 400)
    m = msgs[0]
    path = f"/api/v1/messages/{m['partitionId']}/{m['transactionId']}"
    resp = api.http.delete(path)
    if api.token:
        # tenant A's credential has no admin grant: refused whatever the broker does with deletes
        expect_error(resp, 403)
        assert expect(api.http.get(path), 200).get("deleted") in (False, None)  # and the message stays
    else:
        # authentication off: no grant to check. A broker that deletes answers 2xx (CLI-MSG-DELETE); one
        # that keeps its partitions gapless may refuse loudly with a 409; both are allowed here.
        assert 200 <= resp.status_code < 300 or resp.status_code == 409, (resp.status_code, resp.text[:200])
        if resp.status_code == 409:
            expect_error(resp, 409)


# ------------------------------------------------------------------------------ traces (item 5)

@contract("CLI-TRACES")
def test_traces_record_and_read(api, api_b):
    q, name = uniq("trace"), uniq("flow")
    pushed(api.push(q, ["x"]))
    m = _pop_leased(api, q)["messages"][0]
    body = {"transactionId": m["transactionId"], "partitionId": m["partitionId"], "consumerGroup": "__QUEUE_MODE__",
            "traceNames": [name], "eventType": "info", "data": {"step": 1}}
    out = expect(api.http.post("/api/v1/traces", json=body), (200, 201))
    assert not out.get("error"), out
    got = expect(api.http.get(f"/api/v1/traces/{m['partitionId']}/{m['transactionId']}"), 200)["traces"]
    assert [t["data"] for t in got] == [{"step": 1}], got
    by = expect(api.http.get(f"/api/v1/traces/by-name/{name}"), 200)["traces"]
    assert [t["transactionId"] for t in by] == [m["transactionId"]], by
    names = expect(api.http.get("/api/v1/traces/names", params={"search": name}), 200)["names"]
    assert [n["name"] for n in names] == [name], names
    # another tenant neither reads them nor traces this message
    assert expect(api_b.http.get(f"/api/v1/traces/by-name/{name}"), 200)["traces"] == []
    expect_error(api_b.http.post("/api/v1/traces", json=body), 404, "message_not_found")


# ------------------------------------------------------------------------------ reads by offset (item 6)

@contract("CLI-FETCH")
def test_fetch_by_offset(api, api_b):
    q = uniq("fetch")
    pushed(api.push(q, [0, 1, 2], partition="p"))
    body = {"entries": [{"queue": q, "partition": "p", "offset": 1, "maxBytes": 1 << 20},
                        {"queue": q, "partition": "nope", "offset": 0, "maxBytes": 1 << 20},
                        {"queue": q, "partition": "p", "offset": 9, "maxBytes": 1 << 20}], "maxBytes": 1 << 20}
    a, b, c = expect(api.http.post("/api/v1/fetch", json=body), 200)["entries"]
    assert [(r["offset"], r["payload"]) for r in a["records"]] == [(1, 1), (2, 2)], a
    assert a["highWatermark"] == 3 and a["logStartOffset"] == 0 and not a.get("error"), a
    assert b.get("error") == "UNKNOWN_TOPIC_OR_PARTITION" and b["records"] == [], b
    assert c.get("error") == "OFFSET_OUT_OF_RANGE", c
    one = expect(api.http.post("/api/v1/fetch", json={"entries": [{"queue": q, "partition": "p", "offset": 0,
                                                                   "maxBytes": 1}], "maxBytes": 1}), 200)
    assert [r["offset"] for r in one["entries"][0]["records"]] == [0]
    assert len(api.pop(q)) == 3, "a fetch does not consume"
    other = expect(api_b.http.post("/api/v1/fetch", json=body), 200)["entries"][0]
    assert other.get("error") == "UNKNOWN_TOPIC_OR_PARTITION", other
    expect_error(api.http.post("/api/v1/fetch", json={"entries": []}), 400)


@contract("CLI-CHANGED-SINCE")
def test_partitions_changed_since(api):
    q = uniq("changed")
    pushed(api.push(q, [1], partition="a"))
    pushed(api.push(q, [2], partition="b"))
    first = expect(api.http.post("/api/v1/partitions/changed", json={"entries": [{"queue": q, "limit": 1}]}), 200)
    page = first["entries"][0]
    assert [p["name"] for p in page["partitions"]] == ["a"] and page.get("next"), first
    second = expect(api.http.post("/api/v1/partitions/changed",
                                  json={"entries": [{"queue": q, "limit": 1, "after": page["next"]}]}), 200)
    assert [p["name"] for p in second["entries"][0]["partitions"]] == ["b"], second
    time.sleep(0.05)
    pushed(api.push(q, [3], partition="b"))
    later = expect(api.http.post("/api/v1/partitions/changed",
                                 json={"entries": [{"queue": q, "limit": 100, "since": first["safeTime"]}]}), 200)
    assert [p["name"] for p in later["entries"][0]["partitions"]] == ["b"], later
    assert later["safeTime"] >= first["safeTime"]
