"""Apply a validated KV call in ONE round trip (``queen_kv_apply``) and shape what it answers.

Expiry is judged by the database (``expires_at > now()``): an expired row is never returned and never
counts as existing, pruned or not. Versions come from one sequence: never reused, 0 = absent.
The KV ops of a call are metered (``kv_ops``) by the same statement, inside the same transaction.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from broker import metering
from broker.kv.calls import KvApply
from broker.kv.parse import READ_BUDGET_BYTES, KvCall
from broker.metrics import KV_OPS
from broker.store.pool import Executor
from broker.store.queries import Q


@dataclass
class Applied:
    results: list[dict[str, Any]]
    abort: dict[str, Any] | None = None  # {"failedIndex","kvReason","version","value"} when a required op lost


async def apply(conn: Executor, tenant: str, call: KvCall, *, base_index: int = 0) -> Applied:
    """Run the call on ``conn`` (inside the caller's transaction, or alone in autocommit on a pool).

    A lost ``required`` precondition rolls back every write of the call (a subtransaction in the
    function) and comes back as ``abort``; the caller decides how to answer it.
    """
    if not call.ops:
        return Applied([])
    kv = KvApply(tenant=tenant, ops=call.ops, base_index=base_index, read_budget_bytes=READ_BUDGET_BYTES,
                 meter_period_s=metering.period_seconds(), meter=True)
    out = await conn.fetchval(Q.kv_apply, *kv.args())
    if "abort" in out:
        return Applied([], abort=out["abort"])
    for name in call.names:
        KV_OPS.labels(name).inc()
    return Applied(out["results"])


def precondition_body(abort: dict[str, Any]) -> dict[str, Any]:
    """Standalone answer (HTTP 200) for a lost required precondition; no ``results``: nothing applied."""
    return {
        "ok": False,
        "reason": "kv_precondition",
        "failedIndex": abort["failedIndex"],
        "kvReason": abort["kvReason"],
        "version": abort["version"],
        "value": abort["value"],
    }
