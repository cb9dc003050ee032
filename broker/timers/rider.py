"""The ``timers`` rider of ``POST /api/v1/transaction``: schedule, reschedule and cancel ops applied in
the same database transaction as the bundle's pushes and acks (broker/riders.py).

A cancel inside a bundle has chosen the schedule route's authorization class: the rider needs the
``produce`` grant, passes ``limits.admit`` like ``POST /api/v1/timers`` and is refused with 403
``timers_disabled`` while an operator has switched scheduling off (503 on the standalone route).
Results carry ``"type": "timer"`` and their ``index`` in the bundle's flat result space.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from broker.auth import Principal
from broker.store.pool import Conn
from broker.timers import service
from broker.timers.parse import TimerOp, parse_ops

if TYPE_CHECKING:
    from broker.context import Broker


class TimersRider:
    name = "timers"

    def parse(self, ops: Any, principal: Principal, broker: Broker) -> list[TimerOp]:
        principal.require("produce")
        return parse_ops(ops, max_ops=broker.settings.timers_max_ops)

    async def admit(self, parsed: list[TimerOp], principal: Principal, broker: Broker) -> None:
        await service.admit(broker, principal, parsed)

    async def apply(
        self, conn: Conn, parsed: list[TimerOp], principal: Principal, broker: Broker, base_index: int
    ) -> list[dict[str, Any]]:
        # The same statement meters the promises it made, in the bundle's transaction (timers_schedule).
        results = await service.apply(conn, broker, principal, parsed, check_switch=True, in_transaction=True,
                                      meter=True)
        return [{"index": base_index + i, "type": "timer", "success": r["ok"], **r} for i, r in enumerate(results)]


RIDER = TimersRider()
