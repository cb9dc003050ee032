"""The ``kv`` rider of ``POST /api/v1/transaction`` (see broker/riders.py for the contract).

At most 64 ops and 256 keys, no getPrefix (400 ``kv_get_prefix_not_allowed_in_transaction``). The ops
run on the bundle's connection inside its transaction, in one round trip; results carry
``"type": "kv"`` and the flat ``index``. A lost ``required`` precondition raises ``RiderAbort`` with
``{"success": false, "reason": "kv_precondition", "failedIndex": <flat index>, "kvReason", "version",
"value"}``: the transaction route rolls the whole bundle back and answers that body with HTTP 200.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from broker import riders
from broker.auth import Principal
from broker.kv import service, store
from broker.kv.parse import MAX_OPS_TX, KvCall, parse_ops
from broker.store.pool import Conn

if TYPE_CHECKING:
    from broker.context import Broker


class KvRider:
    name = "kv"

    def parse(self, ops: Any, principal: Principal, broker: Broker) -> KvCall:
        return parse_ops(ops, max_ops=MAX_OPS_TX, in_tx=True)

    async def admit(self, parsed: KvCall, principal: Principal, broker: Broker) -> None:
        await service.admit(broker, principal, parsed, in_transaction=True)

    async def apply(
        self, conn: Conn, parsed: KvCall, principal: Principal, broker: Broker, base_index: int
    ) -> list[dict[str, Any]]:
        done = await store.apply(conn, principal.tenant, parsed, base_index=base_index)
        if done.abort is not None:
            raise riders.RiderAbort({"success": False, **{k: v for k, v in store.precondition_body(done.abort).items() if k != "ok"}})
        return [{"type": "kv", **r} for r in done.results]


RIDER = KvRider()
