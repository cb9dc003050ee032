"""Timers reaching the log: delivery, the floor, order, once, absent, too_late, failures, encryption."""

from __future__ import annotations

import time
import uuid

import pytest

from conformance.client import b64, configured, expect, parse_ts, poll, uniq
from conformance.plugin import cluster_wide, not_verified

contract = pytest.mark.contract


# ----------------------------------------------------------------------------- identity of the frame


@contract("TMR-MESSAGEID-AT-SCHEDULE", "TMR-PRODUCERSUB-ATTESTED")
def test_frame_carries_schedule_identity(api):
    q, k = uniq("q"), uniq("k")
    txn = uuid.uuid4().hex
    r = api.schedule(q, k, delay_ms=50, txn=txn, payload={"hello": "frame"})
    peek_sub = api.peek_ok(q, k).get("producerSub")
    found = api.wait_delivered(q, txn)
    assert found["messageId"] == r["messageId"], f"frame id {found['messageId']} != scheduled messageId {r['messageId']}"
    msgs = api.drain(q)
    assert len(msgs) == 1 and msgs[0]["id"] == r["messageId"] and msgs[0]["transactionId"] == txn, msgs
    assert msgs[0]["data"] == {"hello": "frame"}
    assert msgs[0].get("partition") == "Default", "no partition given: the frame lands in Default"
    expected_sub = api.sub if api.sub else peek_sub
    if expected_sub is None:
        not_verified("cannot tell the scheduler's authenticated sub (no JWT sub claim, peek shows none)")
    assert found.get("producerSub") == expected_sub, f"frame producerSub {found.get('producerSub')!r} != {expected_sub!r}"
    assert msgs[0].get("producerSub") == expected_sub, msgs[0]


# ----------------------------------------------------------------------------- deliverAt is a floor


@contract("TMR-DELIVERAT-FLOOR", "TMR-FIRE-LAG", "TMR-DELAY-MS")
def test_delivered_not_before_deliver_at(api, target, measure):
    q = uniq("q")
    lags = []
    for delay in (0, 120, 250):
        k, txn = uniq("k"), uuid.uuid4().hex
        r = api.schedule(q, k, delay_ms=delay, txn=txn)
        found = api.wait_delivered(q, txn)
        lag_ms = (parse_ts(found["createdAt"]) - parse_ts(r["deliverAt"])) * 1000
        # the frame's createdAt is written by the broker's clock at commit, like deliverAt: never earlier
        assert lag_ms >= -1.0, f"frame created {-lag_ms:.1f} ms before its deliverAt: {r} {found}"
        lags.append(lag_ms)
    lags.sort()
    measure("timer fire lag ms (createdAt - deliverAt, 3 timers)", [round(x, 1) for x in lags])
    assert lags[len(lags) // 2] <= target.lag_budget_ms, f"median fire lag {lags} ms over the budget {target.lag_budget_ms}"


@contract("TMR-FIRE-LAG-SERIES")
def test_fire_lag_series_exported(api):
    resp = api.http.get("/metrics")
    if resp.status_code in (401, 403, 404):
        not_verified(f"the target does not expose /metrics to this credential ({resp.status_code})")
    expect(resp, 200)
    assert "queen_timers_fire_lag_seconds" in resp.text, "queen_timers_fire_lag_seconds missing from /metrics"


@cluster_wide
@contract("TMR-FIRE-ORDER")
def test_same_cycle_fires_in_expiry_order(api, admin):
    q = uniq("q")
    keys = [uniq("late"), uniq("early"), uniq("mid")]
    delays = [240, 80, 160]
    txns = [uuid.uuid4().hex for _ in keys]
    admin.sweeper_paused(True)
    try:
        ops = [api.schedule_op(q, k, delay_ms=d, txn=t, partition="p") for k, d, t in zip(keys, delays, txns, strict=True)]
        expect(api.timers(ops), 200)
        time.sleep(0.35)  # all three mature while the sweeper is held: they meet in one cycle
    finally:
        admin.sweeper_paused(False)
    for t in txns:
        api.wait_delivered(q, t)
    msgs = api.drain(q)
    order = [m["transactionId"] for m in msgs]
    assert order == [txns[1], txns[2], txns[0]], f"log order {order} is not expiry order"


@contract("TMR-FIRES-ONCE", "TMR-NO-TOMBSTONE")
def test_fires_once_leaves_no_row(api):
    q, k = uniq("q"), uniq("k")
    txn = uuid.uuid4().hex
    api.schedule(q, k, delay_ms=0, txn=txn)
    api.wait_delivered(q, txn)
    poll(lambda: api.peek_ok(q, k)["found"] is False, timeout=5, what="row gone after delivery")
    rows = expect(api.list(q), 200)["rows"]
    assert all(r["timerKey"] != k for r in rows), rows
    msgs = api.drain(q, settle_ms=600)
    assert [m["transactionId"] for m in msgs] == [txn], f"fired more than once: {msgs}"


# ----------------------------------------------------------------------------- absent


@contract("TMR-ABSENT-MAY-BE-DELIVERED", "TMR-ABSENT-OK-FALSE")
def test_absent_after_delivery(api):
    q, k = uniq("q"), uniq("k")
    txn = uuid.uuid4().hex
    api.schedule(q, k, delay_ms=0, txn=txn)
    api.wait_delivered(q, txn)
    c = poll(lambda: (lambda r: r if r["status"] != "too_late" else None)(expect(api.cancel(q, k, txn=txn), 200)),
             timeout=5, what="cancel answering past the claim")
    assert c["status"] == "absent" and c["ok"] is False, f"a delivered timer cancels as absent, ok false: {c}"
    assert api.lookup(q, c["txn"])["found"] is True, "the authority is the log: the echoed txn is there"


@contract("TMR-ABSENT-ECHOES-TXN", "TMR-ABSENT-OK-FALSE")
def test_absent_echoes_txn(api):
    q, k = uniq("reminders"), f"trial:acme:{uuid.uuid4().hex[:6]}"
    txn = f"trial-acme-day7-{uuid.uuid4().hex[:6]}"
    c = expect(api.cancel(q, k, txn=txn), 200)
    assert c == {"ok": False, "status": "absent", "queue": q, "timerKey": k, "txn": txn} or (
        c.get("ok") is False and c.get("status") == "absent" and c.get("queue") == q and c.get("timerKey") == k
        and c.get("txn") == txn), c
    batch = expect(api.timers([{"op": "cancel", "queue": q, "timerKey": k, "txn": txn}]), 200)["results"][0]
    assert batch["ok"] is False and batch["status"] == "absent" and batch["txn"] == txn, batch


@contract("TMR-ABSENT-OTHER-TENANT", "TMR-TENANT-ISOLATION")
def test_other_tenants_cancel_is_absent(api, api_b):
    q, k = uniq("q"), uniq("k")
    txn = uuid.uuid4().hex
    api.schedule(q, k, delay_ms=600_000, txn=txn)
    c = expect(api_b.cancel(q, k, txn=txn), 200)
    assert c["status"] == "absent" and c["ok"] is False, c
    assert api_b.peek_ok(q, k)["found"] is False, "another tenant's timer is invisible"
    assert expect(api_b.list(q), 200)["rows"] == [], "another tenant's list of the queue is empty"
    b_batch = expect(api_b.timers([{"op": "cancel", "queue": q, "timerKey": k}]), 200)["results"][0]
    assert b_batch["status"] == "absent" and b_batch["ok"] is False, b_batch
    assert api.peek_ok(q, k)["found"] is True, "the owner's timer is untouched"
    expect(api.timers([api.schedule_op(q, k, delay_ms=0, txn=txn, op="reschedule")]), 200)
    api.wait_delivered(q, txn)
    assert api_b.lookup(q, txn)["found"] is False, "another tenant cannot find the delivered frame"
    assert api_b.drain(q) == [], "nor pop it"


# ----------------------------------------------------------------------------- too_late and claims


@contract("TMR-TOO-LATE-CANCEL", "TMR-PEEK-CLAIMED", "TMR-TOO-LATE-NEW-KEY")
def test_cancel_of_claimed_timer_is_too_late(api, hooks):
    q, k = uniq("q"), uniq("k")
    txn = uuid.uuid4().hex
    api.schedule(q, k, delay_ms=1000, txn=txn)  # due only after the hold is in place, even on a busy machine
    hooks.hold(q, k, 1500)
    try:
        assert api.peek_ok(q, k)["claimed"] is True
        resp = api.cancel(q, k, txn=txn)
        assert resp.status_code == 200, f"too_late is a verdict: HTTP 200, got {resp.status_code} {resp.text[:200]}"
        c = resp.json()
        assert c["status"] == "too_late" and c["ok"] is False, c
        batch = api.timers([{"op": "cancel", "queue": q, "timerKey": k, "txn": txn}])
        assert batch.status_code == 200, f"too_late in a batch is HTTP 200, got {batch.status_code}"
        assert batch.json()["results"][0]["status"] == "too_late", batch.text
        other = api.schedule(q, uniq("k2"), delay_ms=600_000)
        assert other["ok"] is True, "the remedy is a new key"
        expect(api.cancel(q, other["timerKey"]), 200)
    finally:
        hooks.release(q)
    api.wait_delivered(q, txn)


@contract("TMR-TOO-LATE-RESCHEDULE")
def test_reschedule_of_claimed_timer_is_too_late(api, hooks):
    q, k = uniq("q"), uniq("k")
    txn = uuid.uuid4().hex
    api.schedule(q, k, delay_ms=1000, txn=txn, payload={"v": "old"})
    hooks.hold(q, k, 1500)
    try:
        resp = api.timers([api.schedule_op(q, k, delay_ms=0, payload={"v": "new"}, op="reschedule")])
        assert resp.status_code == 200, f"too_late is a verdict: HTTP 200, got {resp.status_code} {resp.text[:200]}"
        r = resp.json()["results"][0]
        assert r["status"] == "too_late" and r["ok"] is False, r
    finally:
        hooks.release(q)
    api.wait_delivered(q, txn)
    msgs = api.drain(q, settle_ms=200)
    assert [m["data"] for m in msgs] == [{"v": "old"}], f"the old payload is what goes out: {msgs}"


@contract("TMR-TOO-LATE-BOUNDED")
def test_too_late_window_bounded_by_lease(api, hooks):
    q, k = uniq("q"), uniq("k")
    api.schedule(q, k, delay_ms=600_000)
    hooks.hold(q, k, 800)
    t0 = time.monotonic()
    assert expect(api.cancel(q, k), 200)["status"] == "too_late"
    c = poll(lambda: (lambda r: r if r["status"] != "too_late" else None)(expect(api.cancel(q, k), 200)),
             timeout=5, what="claim lease to end")
    assert time.monotonic() - t0 < 3.0, "too_late outlived the claim's lease by far"
    assert c["status"] in ("cancelled", "absent"), c


@contract("TMR-BACKOFF-CANCELLABLE", "TMR-PEEK-BACKOFF-UNCLAIMED")
def test_timer_in_backoff_is_cancellable(api, hooks):
    q, k = uniq("q"), uniq("k")
    hooks.fail(q, 1000, "transient")
    try:
        api.schedule(q, k, delay_ms=0)
        peek = poll(lambda: (lambda p: p if p["found"] and p.get("lastError") and not p["claimed"] else None)(
            api.peek_ok(q, k)), timeout=api.target.fire_timeout, what="timer in backoff after a failed fire")
        assert peek["claimed"] is False
        c = expect(api.cancel(q, k), 200)
        assert c["status"] == "cancelled" and c["ok"] is True, c
    finally:
        hooks.release(q)
    assert api.peek_ok(q, k)["found"] is False


# ----------------------------------------------------------------------------- failing fires


@contract("TMR-FAIL-RETRIED", "TMR-TRANSIENT-FREE")
def test_transient_failures_cost_nothing(api, hooks):
    q, k = uniq("q"), uniq("k")
    txn = uuid.uuid4().hex
    hooks.fail(q, 2, "transient")
    try:
        api.schedule(q, k, delay_ms=0, txn=txn)
        api.wait_delivered(q, txn)
    finally:
        hooks.release(q)
    # while it waited, no attempt was spent: check through a second timer held in backoff
    k2 = uniq("k")
    hooks.fail(q, 1000, "transient")
    try:
        api.schedule(q, k2, delay_ms=0)
        peek = poll(lambda: (lambda p: p if p.get("lastError") else None)(api.peek_ok(q, k2)),
                    timeout=api.target.fire_timeout, what="a transient failure recorded")
        assert peek["attempts"] == 0, f"a transient failure must not spend the attempt budget: {peek}"
        expect(api.cancel(q, k2), 200)
    finally:
        hooks.release(q)


@contract("TMR-PERMANENT-SPENDS", "TMR-RESCHEDULE-RESETS")
def test_permanent_failure_spends_and_reschedule_resets(api, hooks):
    q, k = uniq("q"), uniq("k")
    hooks.fail(q, 10_000, "permanent")  # keeps failing: no delivery can race the reschedule below
    try:
        api.schedule(q, k, delay_ms=0, payload={"v": 1})
        peek = poll(lambda: (lambda p: p if p["found"] and p.get("attempts", 0) >= 1 else None)(api.peek_ok(q, k)),
                    timeout=api.target.fire_timeout, what="a permanent failure spending an attempt")
        assert peek["lastError"], peek
        r = api.schedule(q, k, delay_ms=600_000, payload={"v": 2}, op="reschedule")
        assert r["status"] == "rescheduled", r
        after = api.peek_ok(q, k)
        assert after["attempts"] == 0 and after["lastError"] in (None, ""), f"reschedule must reset: {after}"
        expect(api.cancel(q, k), 200)
    finally:
        hooks.release(q)


@contract("TMR-DLQ-AFTER-MAX", "TMR-DLQ-REPLAY-REFUSED")
def test_exhausted_timer_goes_to_dlq(api, hooks):
    q, k = uniq("q"), uniq("k")
    txn = uuid.uuid4().hex
    rows = hooks.dead_letter_timer(q, k, txn)
    row = rows[0]
    group = row.get("consumerGroup")
    assert group and group != "__QUEUE_MODE__", f"a timer DLQ row names a synthetic consumer group: {row}"
    assert api.peek_ok(q, k)["found"] is False
    assert api.lookup(q, txn)["found"] is False, "an exhausted timer is not delivered"
    dlq_id = row.get("id")
    resp = api.http.post(f"/api/v1/dlq/{dlq_id}/replay")
    from conformance.client import expect_error

    expect_error(resp, 409, "dlq_replay_refused")


# ----------------------------------------------------------------------------- rungs and operators


@contract("TMR-FIRE-NOT-STOPPED-BY-RUNGS")
def test_fire_survives_rungs(api, admin, tenant_a):
    q, k = uniq("q"), uniq("k")
    txn = uuid.uuid4().hex
    api.schedule(q, k, delay_ms=300, txn=txn)
    admin.timers_paused(tenant_a, True)
    admin.set_plan(tenant_a, storageQuotaBytes=1, timersRowQuota=1)
    try:
        api.wait_delivered(q, txn)
    finally:
        admin.clear_plan(tenant_a)
        admin.timers_paused(tenant_a, False)


@cluster_wide
@contract("TMR-FIRE-OPERATOR-STOP")
def test_operator_pauses_the_fire(api, admin):
    q, k = uniq("q"), uniq("k")
    txn = uuid.uuid4().hex
    admin.sweeper_paused(True)
    try:
        api.schedule(q, k, delay_ms=0, txn=txn)
        time.sleep(0.5)
        assert api.lookup(q, txn)["found"] is False, "a paused sweeper must not fire"
        assert api.peek_ok(q, k)["found"] is True
    finally:
        admin.sweeper_paused(False)
    api.wait_delivered(q, txn)


# ----------------------------------------------------------------------------- encryption


def _encrypted_queue(api) -> str:
    q = uniq("enc")
    resp = api.configure(q, encryptionEnabled=True)
    if resp.status_code >= 400:
        not_verified(f"the target cannot create an encrypted queue ({resp.status_code} {resp.text[:160]})")
    return q


@contract("TMR-ENCRYPT-AT-SCHEDULE", "TMR-PEEK-NO-DECRYPT")
def test_encrypted_at_schedule(api):
    q = _encrypted_queue(api)
    k, txn = uniq("k"), uuid.uuid4().hex
    payload = {"secret": "s3cr3t-" + uuid.uuid4().hex}
    api.schedule(q, k, delay_ms=300, txn=txn, payload=payload)
    peek = api.peek_ok(q, k)
    assert peek["encrypted"] is True, peek
    assert peek["payload"] != b64(payload), "peek must show the ciphertext, not decrypt"
    assert payload["secret"].encode() not in _b64decode(peek["payload"])
    api.wait_delivered(q, txn)
    msgs = api.drain(q)
    assert [m["data"] for m in msgs] == [payload], msgs


@contract("TMR-ENCRYPT-LATE-CLEAR")
def test_encryption_switched_on_later(api):
    q = uniq("late")
    configured(api.configure(q))
    k, txn = uniq("k"), uuid.uuid4().hex
    payload = {"plain": uuid.uuid4().hex}
    api.schedule(q, k, delay_ms=400, txn=txn, payload=payload)
    resp = api.configure(q, encryptionEnabled=True)
    if resp.status_code >= 400:
        not_verified(f"the target cannot switch encryption on ({resp.status_code} {resp.text[:160]})")
    peek = api.peek_ok(q, k)
    assert peek["encrypted"] is False and peek["payload"] == b64(payload), peek
    api.wait_delivered(q, txn)
    assert [m["data"] for m in api.drain(q)] == [payload]


@contract("TMR-ENCRYPT-KEY-ROTATED")
def test_key_rotated_between_schedule_and_fire(api):
    not_verified("needs restarting the broker with a different key ring between schedule and fire; "
                 "out of reach over HTTP (the broker's own tests cover it)")


def _b64decode(text: str) -> bytes:
    import base64

    return base64.b64decode(text)


@contract("TMR-PAYLOAD-ZSTD")
def test_zstd_payload(api):
    try:
        import zstandard
    except ImportError:
        not_verified("the zstandard package is not installed next to the suite")
    import base64
    import json

    q, k, txn = uniq("q"), uniq("k"), uuid.uuid4().hex
    doc = {"compressed": "z" * 3000}
    frame = zstandard.ZstdCompressor(level=3, write_content_size=True).compress(json.dumps(doc).encode())
    sent = base64.b64encode(frame).decode()
    op = api.schedule_op(q, k, delay_ms=200, txn=txn, payloadZstd=True)
    op["payload"] = sent
    assert expect(api.timers([op]), 200)["results"][0]["ok"] is True
    peek = api.peek_ok(q, k)
    assert peek["payloadZstd"] is True and peek["payload"] == sent, peek
    api.wait_delivered(q, txn)
    assert [m["data"] for m in api.drain(q)] == [doc]


@contract("TMR-UNDELIVERABLE-PAYLOAD")
def test_undeliverable_payload(api):
    import base64
    import json

    q, k, txn = uniq("q"), uniq("k"), uuid.uuid4().hex
    op = api.schedule_op(q, k, delay_ms=0, txn=txn)
    op["payload"] = base64.b64encode(b"\xff\x00 not json").decode()
    resp = api.timers([op])
    if resp.status_code == 400:
        assert api.peek_ok(q, k)["found"] is False
        return
    assert expect(resp, 200)["results"][0]["ok"] is True

    def dlq_rows():
        r = api.http.get("/api/v1/dlq", params={"queue": q})
        assert r.status_code == 200, r.text[:200]
        try:
            data = json.loads(r.content)
        except ValueError as exc:
            raise AssertionError(f"GET /api/v1/dlq is not valid JSON once the timer is dead-lettered: {exc}: "
                                 f"{r.content[:300]!r}") from None
        return [m for m in data.get("messages", []) if m.get("transactionId") == txn]

    rows = poll(dlq_rows, timeout=api.target.fire_timeout * 2, what="the undeliverable timer in the DLQ")
    assert rows[0].get("errorMessage") or rows[0].get("error"), rows[0]
    assert api.lookup(q, txn)["found"] is False
