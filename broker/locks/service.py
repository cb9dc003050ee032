"""Lock calls against the database, with their admission (``broker/http/locks.py`` calls ``run``).

Admission follows the KV's, because a permit is a KV row: writes (acquire, renew, release) need the
``produce`` grant, a call of gets only ``consume`` or ``produce``; the operator's KV switch refuses the
route (503 ``kv_disabled``); acquires and renews pass the limits rungs (surface ``kv_write``, one op
each). A release never meets a rung: giving a permit back must always be possible (like a timer
cancel). Then every op of the call runs in ONE database round trip (``queen_locks_apply``), metered as
one KV op each in the same transaction.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from broker import limits, metering
from broker.auth import Principal
from broker.locks.parse import LockCall
from broker.metrics import LOCK_OPS
from broker.store.failures import DB_FAILURE, database_error
from broker.store.queries import Q

if TYPE_CHECKING:
    from broker.context import Broker

_VERDICT = {"acquire": "acquired", "renew": "renewed", "release": "released", "get": "held"}


async def admit(broker: Broker, principal: Principal, call: LockCall) -> None:
    if call.writes:
        principal.require("produce")
    elif call.ops and not principal.has("produce"):
        principal.require("consume")
    await limits.check_kv_enabled(broker, principal.tenant, in_transaction=False)
    if call.admitted:
        await limits.admit(broker, principal, "kv_write", call.admitted)


async def run(broker: Broker, principal: Principal, call: LockCall) -> list[dict[str, Any]]:
    """One locks call: admission, then its ops in one round trip; the results index-aligned."""
    await admit(broker, principal, call)
    if not call.ops:
        return []
    try:
        out = await broker.require_pool().fetchval(Q.locks_apply, principal.tenant, call.ops, metering.period_seconds())
    except DB_FAILURE as exc:
        raise database_error(exc) from None
    results: list[dict[str, Any]] = out["results"]
    for op, r in zip(call.ops, results, strict=True):
        LOCK_OPS.labels(op["op"], "granted" if r[_VERDICT[op["op"]]] else "refused").inc()
    return results
