"""KV's call of ``queen_kv_apply`` (``broker/sql/functions/kv.sql``): one typed object, its ``args()`` in
the named query's ``$n`` order (the query names each parameter). See ``broker.timers.calls``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class KvApply:
    """``queen_kv_apply`` (query ``kv_apply``): every op of one call, in one statement."""

    tenant: str
    ops: list[dict[str, Any]]  # normalised ops (sent as one jsonb array)
    base_index: int  # the first op's index in the caller's request (a rider's ops follow others)
    read_budget_bytes: int  # most value bytes the reads of one call may return
    meter_period_s: int
    meter: bool  # meter the ops (kv_ops) in the same transaction

    def args(self) -> tuple[Any, ...]:
        return (self.tenant, self.ops, self.base_index, self.read_budget_bytes, self.meter_period_s, self.meter)
