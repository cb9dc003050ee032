"""The timer routes through HTTP, against the shared broker: one test per contract of
docs/timer-routes.md and docs/protocol.md §3 that needs no dedicated settings."""

from __future__ import annotations

import base64
import random
import re
import time
import uuid
from functools import partial

import httpx
import pytest
import zstandard
from conftest import uniq
from helpers import b64, refused, timer_op

from broker.errors import TIMERS_HINT_HEADER
from broker.timers.parse import SERVER_OWNED

ISO_US = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$")
sched = partial(timer_op, payload=b'{"n": 1}')


def err(r: httpx.Response, status: int, code: str, reason: str | None = None) -> dict:
    body = refused(r, status, code, reason)
    assert body.get("detail")
    return body


# ------------------------------------------------------------------ schedule and the delivered frame


def test_schedule_answer_shape_and_delivered_frame(api):
    q, key, txn = uniq("tq"), "order:9f1:expire", uniq("txn")
    payload = b'{"orderId": "9f1"}'
    [res] = api.timer_results(sched(q, key, delay=150, payload=payload, txn=txn, partition="acme"))
    assert set(res) == {"ok", "status", "queue", "timerKey", "txn", "messageId", "deliverAt"}
    assert res["ok"] is True and res["status"] == "scheduled"
    assert (res["queue"], res["timerKey"], res["txn"]) == (q, key, txn)
    assert ISO_US.match(res["deliverAt"]), res["deliverAt"]
    assert uuid.UUID(res["messageId"]).version == 7
    found = api.wait_fired(q, txn)
    assert found["messageId"] == res["messageId"]
    assert found["transactionId"] == txn
    assert found["partition"] == "acme"
    assert found["producerSub"] == "anonymous"  # auth off: the default sub, never anything from the body
    assert found["createdAt"] >= res["deliverAt"][:23]  # deliverAt is a floor
    [msg] = api.pop_until(q, 1)
    assert msg["data"] == {"orderId": "9f1"} and msg["id"] == res["messageId"]
    # delivery deletes the row: no tombstone
    assert api.peek(q, key).json() == {"found": False, "queue": q, "timerKey": key}


def test_past_and_zero_delays_are_legal_and_fire_on_the_first_cycle(api):
    q = uniq("tq")
    res = api.timer_results(sched(q, "neg", delay=-5000, txn="t-neg"), sched(q, "zero", delay=0, txn="t-zero"))
    assert [r["status"] for r in res] == ["scheduled", "scheduled"]
    api.wait_fired(q, "t-neg", timeout=5)
    api.wait_fired(q, "t-zero", timeout=5)


def test_payload_zstd_is_delivered_decompressed(api):
    q, txn = uniq("tq"), uniq("txn")
    body = b'{"big": "' + b"x" * 5000 + b'"}'
    z = zstandard.ZstdCompressor().compress(body)
    [res] = api.timer_results({**sched(q, "z", delay=0, txn=txn), "payload": b64(z), "payloadZstd": True})
    assert res["ok"]
    [msg] = api.pop_until(q, 1)
    assert msg["data"] == {"big": "x" * 5000}


def test_reschedule_is_the_same_upsert_with_a_new_message_id(api):
    q = uniq("tq")
    [a] = api.timer_results(sched(q, "k", txn="v1"))
    [b] = api.timer_results({**sched(q, "k", txn="v2"), "op": "schedule"})  # op name does not decide the status
    [c] = api.timer_results({**sched(q, "k2", txn="v3"), "op": "reschedule"})
    assert (a["status"], b["status"], c["status"]) == ("scheduled", "rescheduled", "scheduled")
    assert a["messageId"] != b["messageId"]
    peek = api.peek(q, "k").json()
    assert peek["txn"] == "v2" and peek["messageId"] == b["messageId"] and peek["attempts"] == 0


def test_timers_in_one_partition_enter_the_log_in_deliver_at_order(api):
    q = uniq("tq")
    delays = list(range(-400, 0, 8))
    random.Random(7).shuffle(delays)
    ops = [sched(q, f"k{d}", delay=d, txn=f"t{d}", payload=str(d).encode()) for d in delays]
    res = api.timer_results(*ops)
    assert all(r["ok"] for r in res)
    msgs = api.pop_until(q, len(ops))
    assert len(msgs) == len(ops)
    msgs.sort(key=lambda m: m["offset"])
    assert [m["data"] for m in msgs] == sorted(delays)


# ------------------------------------------------------------------ cancel, absent, too_late


def test_delete_cancel_then_absent_echoes_txn(api):
    q = uniq("tq")
    api.timer_results(sched(q, "k", txn="stored-txn"))
    r = api.cancel(q, "k", "whatever")
    assert r.status_code == 200
    assert r.json() == {"ok": True, "status": "cancelled", "queue": q, "timerKey": "k", "txn": "stored-txn"}
    r = api.cancel(q, "k", "trial-acme-day7-v1")
    assert r.status_code == 200
    assert r.json() == {"ok": False, "status": "absent", "queue": q, "timerKey": "k", "txn": "trial-acme-day7-v1"}
    r = api.cancel(q, "k")
    assert r.json() == {"ok": False, "status": "absent", "queue": q, "timerKey": "k", "txn": None}


def test_cancel_inside_post_batch_is_index_aligned(api):
    q = uniq("tq")
    api.timer_results(sched(q, "a"))
    res = api.timer_results({"op": "cancel", "queue": q, "timerKey": "a"}, sched(q, "b"), {"op": "cancel", "queue": q, "timerKey": "nope", "txn": "echo"})
    assert [r["status"] for r in res] == ["cancelled", "scheduled", "absent"]
    assert [r["ok"] for r in res] == [True, True, False]
    assert res[2]["txn"] == "echo"


def test_a_delivered_timer_answers_absent(api):
    q, txn = uniq("tq"), uniq("txn")
    api.timer_results(sched(q, "k", delay=0, txn=txn))
    api.wait_fired(q, txn)
    assert api.cancel(q, "k", txn).json()["status"] == "absent"


def test_claimed_timer_is_too_late_for_cancel_and_reschedule(http, api):
    q = uniq("tq")
    [s] = api.timer_results(sched(q, "k", delay=60_000, txn="orig"))
    r = http.post("/api/v1/test/timers/hold", json={"queue": q, "timerKey": "k", "ms": 30_000})
    assert r.status_code == 200 and r.json()["held"] is True
    assert api.peek(q, "k").json()["claimed"] is True
    r = api.cancel(q, "k", "orig")
    assert r.status_code == 200
    assert r.json() == {"ok": False, "status": "too_late", "queue": q, "timerKey": "k"}
    [res] = api.timer_results({**sched(q, "k", txn="new"), "op": "reschedule"})
    assert res == {"ok": False, "status": "too_late", "queue": q, "timerKey": "k"}
    peek = api.peek(q, "k").json()
    assert peek["txn"] == "orig" and peek["messageId"] == s["messageId"]  # nothing changed
    assert http.post("/api/v1/test/timers/release", json={"queue": q}).json()["released"] == 1
    assert api.peek(q, "k").json()["claimed"] is False
    assert api.cancel(q, "k").json()["status"] == "cancelled"


def test_hold_of_a_missing_timer_says_so(http):
    r = http.post("/api/v1/test/timers/hold", json={"queue": uniq("tq"), "timerKey": "none", "ms": 1000})
    assert r.json() == {"held": False, "claimedUntil": None}


# ------------------------------------------------------------------ peek and list


def test_peek_shape_and_miss(api):
    q = uniq("tq")
    api.timer_results(sched(q, "tenant/42", payload=b'{"p": true}', txn="tx", partition="P1"))
    body = api.peek(q, "tenant/42").json()
    assert set(body) == {"found", "queue", "timerKey", "partition", "deliverAt", "txn", "messageId", "payload",
                         "payloadZstd", "encrypted", "producerSub", "attempts", "lastError", "claimed",
                         "createdAt", "updatedAt"}
    assert body["found"] is True and body["timerKey"] == "tenant/42" and body["partition"] == "P1"
    assert base64.b64decode(body["payload"]) == b'{"p": true}'
    assert body["encrypted"] is False and body["claimed"] is False and body["payloadZstd"] is False
    assert body["attempts"] == 0 and body["lastError"] is None and body["producerSub"] == "anonymous"
    for f in ("deliverAt", "createdAt", "updatedAt"):
        assert ISO_US.match(body[f])
    miss = api.peek(q, "tenant/43")
    assert miss.status_code == 200 and miss.json() == {"found": False, "queue": q, "timerKey": "tenant/43"}


def test_keys_and_queues_with_slashes_and_escapes(http, api):
    q = uniq("tq") + "/sub"
    key = "a b/c%d/é"
    from urllib.parse import quote

    path = f"/api/v1/timers/{quote(q, safe='')}/{quote(key, safe='/')}"
    [res] = api.timer_results(sched(q, key))
    assert res["queue"] == q and res["timerKey"] == key
    assert http.get(path).json()["timerKey"] == key
    assert http.get(f"/api/v1/timers/{quote(q, safe='')}").json()["rows"][0]["timerKey"] == key
    assert http.delete(path).json()["status"] == "cancelled"


def test_list_is_a_keyset_in_byte_order_without_payloads(api):
    q = uniq("tq")
    keys = ["b", "B", "a", "a/1", "Z", "é", "_x", "0"]
    api.timer_results(*[sched(q, k) for k in keys])
    expect = sorted(keys, key=lambda k: k.encode())
    page = api.list_timers(q, limit=3).json()
    assert [r["timerKey"] for r in page["rows"]] == expect[:3]
    assert page["truncated"] is True and page["nextAfter"] == expect[2]
    assert "payload" not in page["rows"][0] and "found" not in page["rows"][0]
    seen, after = [], None
    while True:
        params = {"limit": 3, **({"after": after} if after else {})}
        page = api.list_timers(q, **params).json()
        seen += [r["timerKey"] for r in page["rows"]]
        if not page["truncated"]:
            assert page["nextAfter"] is None
            break
        after = page["nextAfter"]
    assert seen == expect
    # the cursor is exclusive
    assert [r["timerKey"] for r in api.list_timers(q, after="a").json()["rows"]][0] == "a/1"


@pytest.mark.parametrize("limit,expect", [("0", 1), ("-5", 1), ("abc", 100), ("5000", 1000), ("", 100)])
def test_list_limit_is_clamped_never_rejected(limit, expect, api):
    q = uniq("tq")
    api.timer_results(*[sched(q, f"k{i:03}") for i in range(2)])
    r = api.list_timers(q, limit=limit)
    assert r.status_code == 200
    assert len(r.json()["rows"]) == min(expect, 2)
    assert r.json()["truncated"] is (expect < 2)


def test_no_tenant_wide_list(http):
    r = http.get("/api/v1/timers")
    assert r.status_code in (404, 405)
    assert "rows" not in r.json()


# ------------------------------------------------------------------ refusals: 400


@pytest.mark.parametrize("field", sorted(SERVER_OWNED) + ["_private", "_"])
def test_server_owned_fields_are_refused_naming_the_field(field, api):
    q = uniq("tq")
    body = err(api.timers({**sched(q, "k"), field: "x"}), 400, "timers_bad_request", "timers_server_owned_field")
    assert field in body["detail"]
    assert api.peek(q, "k").json()["found"] is False  # nothing applied


@pytest.mark.parametrize(
    "mutate,reason",
    [
        (lambda o: {**o, "op": "fire"}, "timers_bad_op"),
        (lambda o: {**o, "colour": "red"}, "timers_unknown_field"),
        (lambda o: {k: v for k, v in o.items() if k != "txn"}, "timers_txn_required"),
        (lambda o: {k: v for k, v in o.items() if k != "delayMs"}, "timers_delay_required"),
        (lambda o: {**o, "delayMs": 1.5}, "timers_bad_delay"),
        (lambda o: {**o, "delayMs": "100"}, "timers_bad_delay"),
        (lambda o: {**o, "delayMs": True}, "timers_bad_delay"),
        (lambda o: {k: v for k, v in o.items() if k != "payload"}, "timers_payload_required"),
        (lambda o: {**o, "payload": "***"}, "timers_payload_not_base64"),
        (lambda o: {**o, "queue": ""}, "timers_queue_required"),
        (lambda o: {**o, "timerKey": 5}, "timers_key_required"),
        (lambda o: {**o, "timerKey": "a\x00b"}, "timers_bad_name"),
        (lambda o: {**o, "payloadZstd": "yes"}, "timers_bad_payload_zstd"),
        (lambda o: {**o, "payloadZstd": True}, "timers_payload_not_zstd"),
        (lambda o: {**o, "partition": ""}, "timers_bad_partition"),
        (lambda o: ["not", "an", "object"], "timers_bad_op"),
    ],
)
def test_malformed_ops_are_refused_and_change_nothing(mutate, reason, api):
    q = uniq("tq")
    good = sched(q, "good")
    err(api.timers(good, mutate(sched(q, "k"))), 400, "timers_bad_request", reason)
    assert api.peek(q, "good").json()["found"] is False


def test_same_timer_twice_in_one_call_is_refused(api):
    q = uniq("tq")
    body = err(api.timers(sched(q, "k"), {"op": "cancel", "queue": q, "timerKey": "k"}), 400, "timers_bad_request",
               "timers_duplicate_key")
    assert body["index"] == 1
    api.timer_results(sched(q, "k"), sched(q + "x", "k"))  # same key on another queue is another timer


def test_op_count_limit(api):
    q = uniq("tq")
    assert len(api.timer_results(*[sched(q, f"k{i}") for i in range(256)])) == 256
    err(api.timers(*[sched(q, f"j{i}") for i in range(257)]), 400, "timers_bad_request", "timers_too_many_ops")
    assert api.peek(q, "j0").json()["found"] is False


@pytest.mark.parametrize(
    "content,ctype",
    [(b"{not json", "application/json"), (b"[]", "application/json"), (b'{"ops": []}', "application/json"),
     (b"{}", "application/json"), (b'{"operations": {"op": "schedule"}}', "application/json"), (b"", "application/json")],
)
def test_bad_bodies(http, content, ctype):
    r = http.post("/api/v1/timers", content=content, headers={"Content-Type": ctype})
    err(r, 400, "timers_bad_request")


def test_empty_operations_is_an_empty_answer(api):
    r = api.timers()
    assert r.status_code == 200 and r.json() == {"results": []}


# ------------------------------------------------------------------ plan verdicts


def test_horizon_is_403_with_the_hint(api):
    q = uniq("tq")
    r = api.timers(sched(q, "ok", delay=90 * 86_400_000), sched(q, "far", delay=90 * 86_400_000 + 1))
    body = err(r, 403, "timer_horizon_exceeded", "timers_horizon")
    assert body["index"] == 1
    assert r.headers[TIMERS_HINT_HEADER].startswith("DELETE /api/v1/timers/")
    assert api.peek(q, "ok").json()["found"] is False  # whole batch refused


def test_payload_ceiling_on_the_decoded_payload(api):
    q = uniq("tq")
    mib = 1024 * 1024
    ok = b'"' + b"a" * (mib - 2) + b'"'
    assert api.timer_results(sched(q, "exact", payload=ok))[0]["ok"]
    err(api.timers(sched(q, "over", payload=ok + b" ")), 413, "payload_too_large", "timers_payload_too_large")
    # a zstd payload is measured by what it will deliver, not by its compressed size
    z = zstandard.ZstdCompressor().compress(ok + b" ")
    err(api.timers({**sched(q, "zover"), "payload": b64(z), "payloadZstd": True}), 413, "payload_too_large",
        "timers_payload_too_large")


# ------------------------------------------------------------------ the fire never stops on its own


def first_failure(api, q: str, key: str, timeout: float = 10) -> dict:
    """Peek the timer until its first failed fire is recorded (or the timeout passes); the last peek."""
    deadline = time.monotonic() + timeout
    while True:
        peek = api.peek(q, key).json()
        if peek["attempts"] >= 1 or time.monotonic() > deadline:
            return peek
        time.sleep(0.05)


def test_not_json_payload_is_accepted_and_fails_at_the_fire(api):
    """The broker checks JSON at the fire (permanent failure, one attempt spent, backoff, cancellable)."""
    q = uniq("tq")
    api.timer_results(sched(q, "bad", delay=0, payload=b"\xff not json"))
    peek = first_failure(api, q, "bad")
    assert peek["attempts"] >= 1 and "JSON" in peek["lastError"]
    assert peek["claimed"] is False  # in backoff: not claimed...
    assert api.cancel(q, "bad").json()["status"] == "cancelled"  # ...so cancellable


def test_a_reschedule_to_a_payload_that_is_not_json_still_fails_at_the_fire(api):
    """A JSON timer is stored ready for the log (the sweeper fires it inside the database); its reschedule
    to bytes that are not JSON must not keep that: the fire judges them and fails, as for a new timer."""
    q = uniq("tq")
    [a] = api.timer_results(sched(q, "k", delay=60_000, payload=b'{"ok": true}'))
    [b] = api.timer_results(sched(q, "k", delay=0, payload=b"not json either"))
    assert (a["status"], b["status"]) == ("scheduled", "rescheduled")
    peek = first_failure(api, q, "k")
    assert peek["attempts"] >= 1 and "JSON" in peek["lastError"]
    assert api.cancel(q, "k").json()["status"] == "cancelled"


def test_test_hooks_validate_their_bodies(http):
    r = http.post("/api/v1/test/timers/fail", json={"queue": "q", "count": 1, "class": "sometimes"})
    assert r.status_code == 400
    r = http.post("/api/v1/test/timers/hold", json={"queue": "q", "timerKey": "k", "ms": 0})
    assert r.status_code == 400


def test_fire_metrics_are_exported(http, api):
    q, txn = uniq("tq"), uniq("txn")
    api.timer_results(sched(q, "m", delay=0, txn=txn))
    api.wait_fired(q, txn)
    text = http.get("/metrics/prometheus").text
    counts = {}
    for line in text.splitlines():
        for name in ("queen_timers_fire_lag_seconds_count", "queen_timers_fired_total", "queen_sweeper_cycle_seconds_count"):
            if line.startswith(name):
                counts[name] = float(line.split()[-1])
    assert counts.get("queen_timers_fire_lag_seconds_count", 0) >= 1, counts
    assert counts.get("queen_timers_fired_total", 0) >= 1 and counts.get("queen_sweeper_cycle_seconds_count", 0) >= 1
