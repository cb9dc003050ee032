"""The ``timers`` rider of ``POST /api/v1/transaction``: schedule, reschedule and cancel ops applied in
the same database transaction as the bundle's pushes and acks (broker/riders.py).

A cancel inside a bundle has chosen the schedule route's authorization class: the rider needs the
``produce`` grant, passes ``limits.admit`` like ``POST /api/v1/timers`` and is refused with 403
``timers_disabled`` while an operator has switched scheduling off (503 on the standalone route).
Results carry ``"type": "timer"`` and their ``index`` in the bundle's flat result space.
"""

from __future__ import annotations

from typing import Any

import asyncpg

from broker import metering
from broker.timers import service
from broker.timers.ops import TimerOp, parse_ops


class TimersRider:
    name = "timers"

    def parse(self, ops: Any, principal: Any, broker: Any) -> list[TimerOp]:
        principal.require("produce")
        return parse_ops(ops, max_ops=broker.settings.timers_max_ops)

    async def admit(self, parsed: list[TimerOp], principal: Any, broker: Any) -> None:
        await service.admit(broker, principal, parsed)

    async def apply(
        self, conn: asyncpg.Connection, parsed: list[TimerOp], principal: Any, broker: Any, base_index: int
    ) -> list[dict[str, Any]]:
        results = await service.apply(conn, broker, principal, parsed, check_switch=True, in_transaction=True)
        n = service.applied_schedules(results)
        if n:
            await metering.record(conn, principal.tenant, messages=n)
        return [{"index": base_index + i, "type": "timer", "success": r["ok"], **r} for i, r in enumerate(results)]


RIDER = TimersRider()
