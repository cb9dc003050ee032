"""Timer routes: the batch route, the DELETE cancel route, scheduling, server-owned fields, statuses."""

from __future__ import annotations

import re
import uuid

import pytest

from conformance.client import STATUSES, TIMERS, b64, expect, expect_error, parse_ts, uniq

contract = pytest.mark.contract


def _assert_result_element(r: dict) -> None:
    assert isinstance(r, dict), r
    assert isinstance(r.get("ok"), bool), f"result without a boolean ok: {r}"
    assert r.get("status") in STATUSES, f"status {r.get('status')!r} is outside the closed taxonomy: {r}"
    assert (r["ok"] is True) == (r["status"] in ("scheduled", "rescheduled", "cancelled")), f"ok/status disagree: {r}"


# ----------------------------------------------------------------------------- The routes


@contract("TMR-POST-PRODUCE-GRANT")
def test_produce_only_credential_schedules(api_produce_only, api):
    q, k = uniq("q"), uniq("k")
    r = api_produce_only.schedule(q, k, delay_ms=600_000)
    assert r["ok"] is True and r["status"] == "scheduled", r
    assert api.peek_ok(q, k)["found"] is True
    expect(api.cancel(q, k), 200)


@contract("TMR-POST-WRITE-ONLY")
def test_post_carries_no_read_ops(api):
    q, k = uniq("q"), uniq("k")
    api.schedule(q, k, delay_ms=600_000)
    for op in ("peek", "get", "list"):
        resp = api.timers([{"op": op, "queue": q, "timerKey": k}])
        expect_error(resp, 400)
    expect(api.cancel(q, k), 200)


@contract("TMR-NO-TENANT-LIST")
def test_no_tenant_wide_list(api):
    q, k = uniq("q"), uniq("k")
    api.schedule(q, k, delay_ms=600_000)
    for path, params in ((TIMERS, None), (TIMERS + "/", None), (TIMERS, {"queue": q})):
        resp = api.http.get(path, params=params)
        assert resp.status_code in (400, 404, 405), f"GET {path} {params} must not list timers: {resp.status_code} {resp.text[:200]}"
        assert k not in resp.text
    expect(api.cancel(q, k), 200)


@contract("TMR-KEY-CATCH-ALL")
def test_timer_key_with_slashes(api):
    q = uniq("q")
    key = f"tenant/42/{uuid.uuid4().hex[:6]}"
    r = api.schedule(q, key, delay_ms=600_000)
    assert r["ok"] is True and r["timerKey"] == key, r
    peek = api.peek_ok(q, key)
    assert peek["found"] is True and peek["timerKey"] == key, peek
    rows = expect(api.list(q), 200)["rows"]
    assert [row["timerKey"] for row in rows] == [key]
    c = expect(api.cancel(q, key), 200)
    assert c["status"] == "cancelled" and c["timerKey"] == key, c


# ----------------------------------------------------------------------------- Cancel is not schedule


@contract("TMR-CANCEL-WITHDRAWS")
def test_cancelled_timer_never_delivered(api):
    q = uniq("q")
    k1, k2 = uniq("k"), uniq("k")
    t1, t2, t3 = uuid.uuid4().hex, uuid.uuid4().hex, uuid.uuid4().hex
    expect(api.timers([api.schedule_op(q, k1, delay_ms=250, txn=t1), api.schedule_op(q, k2, delay_ms=250, txn=t2)]),
           200)
    assert expect(api.cancel(q, k1), 200)["status"] == "cancelled"
    assert expect(api.timers([{"op": "cancel", "queue": q, "timerKey": k2}]), 200)["results"][0]["status"] == "cancelled"
    control = api.schedule(q, uniq("k"), delay_ms=300, txn=t3)
    assert control["ok"]
    api.wait_delivered(q, t3)  # a timer due later than both has fired: the cancelled ones had their chance
    assert api.lookup(q, t1)["found"] is False and api.lookup(q, t2)["found"] is False
    assert [m["transactionId"] for m in api.drain(q)] == [t3]


@contract("TMR-CANCEL-ROUTE")
def test_delete_cancels(api):
    q, k = uniq("q"), uniq("k")
    s = api.schedule(q, k, delay_ms=600_000)
    resp = api.cancel(q, k)
    c = expect(resp, 200)
    assert isinstance(c, dict) and "results" not in c, f"DELETE answers the single result object: {c}"
    assert c["ok"] is True and c["status"] == "cancelled", c
    assert c["queue"] == q and c["timerKey"] == k and c["txn"] == s["txn"], c
    assert api.peek_ok(q, k)["found"] is False
    # a cancel that finds the timer answers the stored txn, whatever the query parameter says
    s2 = api.schedule(q, k, delay_ms=600_000)
    c2 = expect(api.cancel(q, k, txn="not-the-stored-one"), 200)
    assert c2["status"] == "cancelled" and c2["txn"] == s2["txn"], c2


@contract("TMR-CANCEL-NO-GRANT", "TMR-BATCH-CANCEL-AUTH")
def test_cancel_without_produce_grant(api, api_consume_only):
    q, k = uniq("q"), uniq("k")
    api.schedule(q, k, delay_ms=600_000)
    # inside the batch, a cancel has chosen the schedule route's authorization
    resp = api_consume_only.timers([{"op": "cancel", "queue": q, "timerKey": k}])
    expect_error(resp, 403)
    assert api.peek_ok(q, k)["found"] is True, "a refused batch cancel must not cancel"
    # the DELETE route does not ask for the produce grant
    c = expect(api_consume_only.cancel(q, k), 200)
    assert c["ok"] is True and c["status"] == "cancelled", c
    assert api.peek_ok(q, k)["found"] is False


# ----------------------------------------------------------------------------- Scheduling


@contract("TMR-SCHEDULE-EXAMPLE")
def test_schedule_example_body(api):
    q = uniq("reminders")
    key = f"trial:acme:{uuid.uuid4().hex[:6]}:day7"
    txn = f"trial-acme-day7-{uuid.uuid4().hex[:6]}"
    op = {"op": "schedule", "queue": q, "timerKey": key, "delayMs": 604800000, "txn": txn,
          "payload": "eyJraW5kIjoiZGF5NyJ9", "partition": "acme"}
    data = expect(api.timers([op]), 200)
    r = data["results"][0]
    assert r["ok"] is True and r["status"] == "scheduled" and r["txn"] == txn, r
    peek = api.peek_ok(q, key)
    assert peek["found"] is True and peek["partition"] == "acme" and peek["payload"] == "eyJraW5kIjoiZGF5NyJ9", peek
    expect(api.cancel(q, key), 200)


@contract("TMR-UPSERT")
def test_repeated_schedule_is_one_timer(api):
    q, k = uniq("q"), uniq("k")
    txn = uuid.uuid4().hex
    first = api.schedule(q, k, delay_ms=150, txn=txn, payload={"n": 1})
    again = api.schedule(q, k, delay_ms=150, txn=txn, payload={"n": 1})  # a client retry after a crash
    assert first["status"] == "scheduled" and again["status"] == "rescheduled", (first, again)
    rows = expect(api.list(q), 200)["rows"]
    assert len(rows) == 1, rows
    api.wait_delivered(q, txn)
    msgs = api.drain(q, settle_ms=300)
    assert [m.get("transactionId") for m in msgs] == [txn], msgs


@contract("TMR-UPSERT-STATUS-BY-ROW")
def test_status_decided_by_row(api):
    q = uniq("q")
    k1, k2 = uniq("k"), uniq("k")
    r = api.schedule(q, k1, delay_ms=600_000, op="reschedule")
    assert r["status"] == "scheduled" and r["ok"] is True, f"reschedule of a missing key creates it: {r}"
    api.schedule(q, k2, delay_ms=600_000)
    r = api.schedule(q, k2, delay_ms=600_000, op="schedule")
    assert r["status"] == "rescheduled", f"schedule over an existing key is a reschedule: {r}"
    expect(api.cancel(q, k1), 200)
    expect(api.cancel(q, k2), 200)


@contract("TMR-UPSERT-PER-TENANT")
def test_upsert_key_includes_tenant(api, api_b):
    q, k = uniq("q"), uniq("k")
    a = api.schedule(q, k, delay_ms=600_000, payload={"who": "a"})
    b = api_b.schedule(q, k, delay_ms=600_000, payload={"who": "b"})
    assert a["status"] == "scheduled" and b["status"] == "scheduled", (a, b)
    assert api.peek_ok(q, k)["payload"] == b64({"who": "a"})
    assert api_b.peek_ok(q, k)["payload"] == b64({"who": "b"})
    expect(api.cancel(q, k), 200)
    expect(api_b.cancel(q, k), 200)


@contract("TMR-RESCHEDULE-NEW-MESSAGE")
def test_reschedule_is_a_new_message(api):
    q, k = uniq("q"), uniq("k")
    old_txn, new_txn = uuid.uuid4().hex, uuid.uuid4().hex
    first = api.schedule(q, k, delay_ms=600_000, txn=old_txn, payload={"v": 1})
    second = api.schedule(q, k, delay_ms=0, txn=new_txn, payload={"v": 2}, op="reschedule")
    assert second["status"] == "rescheduled" and second["txn"] == new_txn, second
    assert second["messageId"] != first["messageId"], "a reschedule is a new message: new messageId"
    found = api.wait_delivered(q, new_txn)
    assert found["messageId"] == second["messageId"], found
    msgs = api.drain(q, settle_ms=200)
    assert [m.get("transactionId") for m in msgs] == [new_txn], msgs
    assert msgs[0]["data"] == {"v": 2}
    assert api.lookup(q, old_txn)["found"] is False


@contract("TMR-RELATIVE-ONLY")
def test_absolute_instants_refused(api):
    q = uniq("q")
    for field, value in (("deliverAt", "2030-01-01T00:00:00.000000Z"), ("deliver_at", "2030-01-01T00:00:00Z"),
                         ("delaySeconds", 5)):
        k = uniq("k")
        op = api.schedule_op(q, k, delay_ms=1000)
        op[field] = value
        expect_error(api.timers([op]), 400)
        assert api.peek_ok(q, k)["found"] is False, f"{field}: a refused op must not schedule"
    k = uniq("k")
    op = api.schedule_op(q, k)
    del op["delayMs"]
    op["deliverAt"] = "2030-01-01T00:00:00.000000Z"
    expect_error(api.timers([op]), 400)
    assert api.peek_ok(q, k)["found"] is False


@contract("TMR-ONE-CLOCK", "TMR-DELAY-MS")
def test_deliver_at_is_now_plus_delay(api):
    q = uniq("q")
    ops = [api.schedule_op(q, uniq("k"), delay_ms=d) for d in (600_000, 600_250, 601_000)]
    res = expect(api.timers(ops), 200)["results"]
    ts = [parse_ts(r["deliverAt"]) for r in res]
    # one call, one transaction, one clock: the differences are exactly the delay differences (ms)
    assert abs((ts[1] - ts[0]) * 1000 - 250) < 1.5, res
    assert abs((ts[2] - ts[0]) * 1000 - 1000) < 1.5, res
    for op in ops:
        expect(api.cancel(q, op["timerKey"]), 200)


# ----------------------------------------------------------------------------- Fields the server owns


@pytest.mark.parametrize("field,value", [("producerSub", "billing-service"), ("producer_sub", "billing-service")])
@contract("TMR-OWNED-PRODUCERSUB")
def test_producer_sub_is_not_input(api, field, value):
    _refused_owned(api, field, value)


@pytest.mark.parametrize("field", ["messageId", "message_id"])
@contract("TMR-OWNED-MESSAGEID")
def test_message_id_is_not_input(api, field):
    _refused_owned(api, field, str(uuid.uuid4()))


@pytest.mark.parametrize("field", ["tenant", "tenantId", "tenant_id"])
@contract("TMR-OWNED-TENANT")
def test_tenant_is_not_input(api, field):
    _refused_owned(api, field, "someone-else")


@pytest.mark.parametrize("field", ["_internal", "_claimToken", "__proto__"])
@contract("TMR-OWNED-UNDERSCORE")
def test_underscore_fields_are_not_input(api, field):
    _refused_owned(api, field, "x")


def _refused_owned(api, field: str, value: object) -> None:
    q, k = uniq("q"), uniq("k")
    op = api.schedule_op(q, k, delay_ms=600_000)
    op[field] = value
    err = expect_error(api.timers([op]), 400)
    assert field in err["detail"] or field in str(err), f"the refusal should name the field {field!r}: {err}"
    assert api.peek_ok(q, k)["found"] is False, "never a silent drop: nothing scheduled"


# ----------------------------------------------------------------------------- taxonomy, shapes, validation


@contract("TMR-SCHEDULE-RESULT")
def test_schedule_result_shape(api):
    q, k = uniq("q"), uniq("k")
    txn = uuid.uuid4().hex
    r = api.schedule(q, k, delay_ms=600_000, txn=txn)
    for key in ("ok", "status", "queue", "timerKey", "txn", "messageId", "deliverAt"):
        assert key in r, f"schedule result lacks {key!r}: {r}"
    assert r["ok"] is True and r["status"] == "scheduled"
    assert r["queue"] == q and r["timerKey"] == k and r["txn"] == txn
    uuid.UUID(r["messageId"])
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z", r["deliverAt"]), r["deliverAt"]
    parse_ts(r["deliverAt"])
    expect(api.cancel(q, k), 200)


@contract("TMR-STATUS-CLOSED")
def test_status_taxonomy_closed(api):
    q, k = uniq("q"), uniq("k")
    seen = []
    seen.append(api.schedule(q, k, delay_ms=600_000))
    seen.append(api.schedule(q, k, delay_ms=600_000))
    seen.append(expect(api.cancel(q, k), 200))
    seen.append(expect(api.cancel(q, k), 200))
    seen.extend(expect(api.timers([api.schedule_op(q, k, delay_ms=600_000),
                                   {"op": "cancel", "queue": q, "timerKey": uniq("k")}]), 200)["results"])
    seen.append(expect(api.timers([{"op": "cancel", "queue": q, "timerKey": k}]), 200)["results"][0])
    for r in seen:
        _assert_result_element(r)
    assert [r["status"] for r in seen] == ["scheduled", "rescheduled", "cancelled", "absent", "scheduled", "absent",
                                           "cancelled"], seen


@contract("TMR-INDEX-ALIGNED", "TMR-POST-CARRIES-CANCELS")
def test_results_index_aligned(api):
    q = uniq("q")
    keys = [uniq(f"k{i}") for i in range(5)]
    api.schedule(q, keys[2], delay_ms=600_000)
    ops = [api.schedule_op(q, keys[0], delay_ms=600_000),
           {"op": "cancel", "queue": q, "timerKey": keys[1]},
           {"op": "cancel", "queue": q, "timerKey": keys[2]},
           api.schedule_op(q, keys[3], delay_ms=600_000, op="reschedule"),
           api.schedule_op(q, keys[4], delay_ms=600_000)]
    res = expect(api.timers(ops), 200)["results"]
    assert len(res) == len(ops), res
    assert [r["timerKey"] for r in res] == keys, res
    assert [r["status"] for r in res] == ["scheduled", "absent", "cancelled", "scheduled", "scheduled"], res
    for k in (keys[0], keys[3], keys[4]):
        expect(api.cancel(q, k), 200)


@contract("TMR-BAD-BATCH-CHANGES-NOTHING")
def test_bad_batch_applies_nothing(api):
    q = uniq("q")
    good, bad = uniq("k"), uniq("k")
    bad_op = api.schedule_op(q, bad, delay_ms=1000)
    bad_op["producerSub"] = "forged"
    expect_error(api.timers([api.schedule_op(q, good, delay_ms=600_000), bad_op]), 400)
    assert api.peek_ok(q, good)["found"] is False, "the valid op of a refused batch must not apply"
    expect_error(api.timers([api.schedule_op(q, good, delay_ms=600_000), {"op": "frobnicate", "queue": q}]), 400)
    assert api.peek_ok(q, good)["found"] is False


@contract("TMR-VALIDATION")
def test_malformed_ops(api):
    q, k = uniq("q"), uniq("k")
    cases = [
        {"op": "explode", "queue": q, "timerKey": k, "delayMs": 1, "txn": "t", "payload": b64(1)},
        {"op": "schedule", "timerKey": k, "delayMs": 1, "txn": "t", "payload": b64(1)},
        {"op": "schedule", "queue": q, "delayMs": 1, "txn": "t", "payload": b64(1)},
        {"op": "schedule", "queue": q, "timerKey": k, "txn": "t", "payload": b64(1)},
        {"op": "schedule", "queue": q, "timerKey": k, "delayMs": "soon", "txn": "t", "payload": b64(1)},
        {"op": "schedule", "queue": q, "timerKey": k, "delayMs": 1, "txn": "t", "payload": "not base64 !!"},
        {"op": "schedule", "queue": "", "timerKey": k, "delayMs": 1, "txn": "t", "payload": b64(1)},
    ]
    for op in cases:
        expect_error(api.timers([op]), 400)
    dup = [api.schedule_op(q, k, delay_ms=600_000), api.schedule_op(q, k, delay_ms=600_000)]
    expect_error(api.timers(dup), 400)
    for raw in ({"operations": "x"}, {"ops": []}, [1, 2]):
        expect_error(api.http.post(TIMERS, json=raw), 400)
    assert api.peek_ok(q, k)["found"] is False


@contract("TMR-PAST-DELAY")
def test_past_delay_is_legal(api):
    q, k = uniq("q"), uniq("k")
    txn = uuid.uuid4().hex
    ops = [api.schedule_op(q, k, delay_ms=-5000, txn=txn), api.schedule_op(q, uniq("k"), delay_ms=600_000)]
    res = expect(api.timers(ops), 200)["results"]
    assert res[0]["ok"] is True and res[0]["status"] == "scheduled", res[0]
    assert parse_ts(res[1]["deliverAt"]) - parse_ts(res[0]["deliverAt"]) > 600, "deliverAt = now + delayMs, in the past"
    api.wait_delivered(q, txn)
    expect(api.cancel(q, ops[1]["timerKey"]), 200)
