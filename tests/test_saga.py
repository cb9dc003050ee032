"""The saga of docs/timer-routes.md §10, end to end with the official client against the shared broker.

A saga opens by writing its state to KV and scheduling a compensation timer in ONE transaction. The
closing bundle writes the final state (fenced by the version it read) and cancels the compensation
timer, again in one transaction. The seed's bold case: the timer fired 5 ms before the cancel, so the
cancel answers ``absent`` (ok: false) inside a bundle that otherwise succeeded, and the compensation
message is already in the queue. The only correct consumer reads the saga's KV state FIRST and
compensates only under a fence on that state, in the same transaction as its ack.
"""

from __future__ import annotations

from conftest import uniq
from helpers import await_delivered
from queen import Queen


class Saga:
    def __init__(self, client: Queen) -> None:
        self.client = client
        self.ns = uniq("saga")
        self.comp_q = uniq("compensate")
        self.inventory_q = uniq("inventory")

    async def open(self, saga_id: str, compensate_after_ms: int) -> int:
        tx = self.client.transaction()
        tx.kv.put_if_absent(self.ns, saga_id, {"state": "reserved"}, forever=True, required=True)
        tx.timer(self.comp_q).key(f"{saga_id}/compensate").payload({"saga": saga_id}).after_ms(
            compensate_after_ms
        ).txn(f"comp-{saga_id}").schedule()
        res = await tx.commit()
        assert res, res
        kv_res, timer_res = res["results"]
        assert kv_res["type"] == "kv" and kv_res["applied"] and timer_res["status"] == "scheduled"
        return kv_res["version"]

    async def close(self, saga_id: str, version: int):
        """The closing bundle: the final state, fenced, plus the cancel of the compensation timer."""
        tx = self.client.transaction()
        tx.kv.put(self.ns, saga_id, {"state": "shipped"}, forever=True, expect=version, required=True)
        tx.timer(self.comp_q).key(f"{saga_id}/compensate").txn(f"comp-{saga_id}").cancel()
        return await tx.commit()

    async def compensation_consumer(self) -> list[str]:
        """Reads the saga state before compensating; compensates only under a fence on that state."""
        outcomes = []
        for msg in await self.client.queue(self.comp_q).batch(10).wait(False).pop():
            saga_id = msg["data"]["saga"]
            state = await self.client.kv.get(self.ns, saga_id)
            tx = self.client.transaction().ack(msg)
            if state and state["value"]["state"] == "reserved":
                tx.kv.put(self.ns, saga_id, {"state": "compensated"}, forever=True, expect=state["version"], required=True)
                tx.queue(self.inventory_q).push([{"data": {"release": saga_id}}])
                res = await tx.commit()
                outcomes.append("compensated" if res else "lost-race")
            else:
                assert await tx.commit()
                outcomes.append("skipped")
        return outcomes

    async def state(self, saga_id: str) -> str:
        return (await self.client.kv.get(self.ns, saga_id))["value"]["state"]

    async def released(self) -> list:
        return [m["data"] for m in await self.client.queue(self.inventory_q).batch(10).wait(False).pop()]


async def test_closing_bundle_cancels_the_compensation_with_the_state_write(queen_client):
    saga = Saga(queen_client)
    v = await saga.open("order-1", compensate_after_ms=60_000)
    res = await saga.close("order-1", v)
    assert res and res["success"] is True
    kv_res, timer_res = res["results"]
    assert kv_res["applied"] and timer_res["status"] == "cancelled" and timer_res["ok"] is True
    assert await saga.state("order-1") == "shipped"
    assert not await queen_client.timers.peek(saga.comp_q, "order-1/compensate")
    assert await saga.compensation_consumer() == []


async def test_timer_fired_5ms_before_the_cancel(queen_client):
    saga = Saga(queen_client)
    v = await saga.open("order-2", compensate_after_ms=0)
    # the compensation fires before the closing bundle gets there
    await await_delivered(queen_client, saga.comp_q, "comp-order-2", interval=0.02, what="compensation comp-order-2 was not delivered")
    res = await saga.close("order-2", v)
    # the bundle succeeds: the state is written, and the cancel answers absent, which is NOT a success
    assert res and res["success"] is True
    kv_res, timer_res = res["results"]
    assert kv_res["applied"] is True
    assert timer_res["ok"] is False and timer_res["status"] == "absent" and timer_res["txn"] == "comp-order-2"
    # the compensation message IS in the queue: a consumer that trusted the cancel would unwind a
    # shipped reservation. The correct consumer reads the state first and skips.
    assert await saga.compensation_consumer() == ["skipped"]
    assert await saga.state("order-2") == "shipped"
    assert await saga.released() == []
    assert await saga.compensation_consumer() == []  # acked: not delivered again


async def test_compensation_first_fences_out_the_closing_bundle(queen_client):
    saga = Saga(queen_client)
    v = await saga.open("order-3", compensate_after_ms=0)
    await await_delivered(queen_client, saga.comp_q, "comp-order-3", interval=0.02, what="compensation comp-order-3 was not delivered")
    assert await saga.compensation_consumer() == ["compensated"]
    assert await saga.released() == [{"release": "order-3"}]
    # the late closing bundle loses its fence: the whole bundle is rolled back and returned, not raised
    res = await saga.close("order-3", v)
    assert not res and res["reason"] == "kv_precondition" and res["failedIndex"] == 0
    assert res["kvReason"] == "version" and res["value"] == {"state": "compensated"}
    assert await saga.state("order-3") == "compensated"
