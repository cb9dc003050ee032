"""Plans, quotas and degradation rungs (issue 6 fills this in; the interface is fixed here).

Callers on produce-class work call ``await admit(broker, principal, surface, ops)`` BEFORE opening
their transaction; it raises the rung's ``ApiError`` (429 rate_limited / quota_exceeded, 403
storage_quota_exceeded / timers_quota_exceeded / timers_paused / cluster_suspended) or returns.
Surfaces: ``"push"`` (ops = messages), ``"timers"`` (ops = schedule+reschedule ops in the call; a
call with only cancels still passes through here, since POST /api/v1/timers is the schedule route's
authorization class), ``"kv_write"`` (ops = write ops). The DELETE timer cancel route never calls it.

``await plan_for(broker, tenant)`` returns the tenant's effective ``Plan``: each field the minimum of
the cell default (Settings) and the tenant's own plan, which can only narrow it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Plan:
    timers_horizon_ms: int
    max_payload_bytes: int
    timers_row_quota: int
    rate_limit_per_s: int
    period_quota_messages: int
    storage_quota_bytes: int

    @property
    def timer_payload_ceiling(self) -> int:
        """min(1 MiB, the plan's max payload): a timer becomes a message, so no ceiling of its own."""
        return min(1024 * 1024, self.max_payload_bytes)


def cell_plan(settings: Any) -> Plan:
    return Plan(
        timers_horizon_ms=settings.timers_horizon_ms,
        max_payload_bytes=settings.max_payload_bytes,
        timers_row_quota=settings.timers_row_quota,
        rate_limit_per_s=settings.rate_limit_per_s,
        period_quota_messages=settings.period_quota_messages,
        storage_quota_bytes=settings.storage_quota_bytes,
    )


async def plan_for(broker: Any, tenant: str) -> Plan:
    return cell_plan(broker.settings)


async def admit(broker: Any, principal: Any, surface: str, ops: int) -> None:
    return None
