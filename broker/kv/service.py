"""KV calls against the database, with their admission (the routes in ``broker/http/kv.py`` and the
transaction rider in ``broker/kv/rider.py`` both pass through ``admit``).

Admission, in order: the grants (writes need ``produce``; a call of reads only needs ``consume`` or
``produce``), the operator's KV switch (503 ``kv_disabled`` on the routes, 403 in a transaction), then
for a call with writes the limits rungs (surface ``kv_write``, one op per write).
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import TYPE_CHECKING

from broker import limits
from broker.auth import Principal
from broker.kv import store
from broker.kv.parse import KvCall
from broker.store.failures import DB_FAILURE, database_error

if TYPE_CHECKING:
    from broker.context import Broker


def require_grants(principal: Principal, call: KvCall) -> None:
    """Writes need ``produce``; a call of reads only needs ``consume`` or ``produce``."""
    if call.writes:
        principal.require("produce")
    elif call.reads and not principal.has("produce"):
        principal.require("consume")


async def admit(broker: Broker, principal: Principal, call: KvCall, *, in_transaction: bool) -> None:
    require_grants(principal, call)
    await limits.check_kv_enabled(broker, principal.tenant, in_transaction=in_transaction)
    if call.writes:
        await limits.admit(broker, principal, "kv_write", call.writes)


async def apply_db(work: Awaitable[store.Applied]) -> store.Applied:
    """Run the database part of a KV call; a database that cannot answer is the same 503 every surface
    answers (``unavailable`` / ``database_unavailable`` or ``database_conflict``, with Retry-After)."""
    try:
        return await work
    except DB_FAILURE as exc:
        raise database_error(exc) from None


async def run(broker: Broker, principal: Principal, call: KvCall) -> store.Applied:
    """One KV call outside a transaction: admission, then its ops in one database round trip."""
    await admit(broker, principal, call, in_transaction=False)
    return await apply_db(store.apply(broker.require_pool(), principal.tenant, call))
