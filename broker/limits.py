"""Plans, quotas and degradation rungs.

Callers on produce-class work call ``await admit(broker, principal, surface, ops)`` BEFORE opening
their transaction; it raises the rung's ``ApiError`` or returns. Surfaces: ``"push"`` (ops = messages),
``"timers"`` (ops = schedule+reschedule ops in the call; a call with only cancels still passes through
here with ops=0, since POST /api/v1/timers is the schedule route's authorization class),
``"kv_write"`` (ops = write ops). The DELETE timer cancel route never calls it.

The rungs, in the order they are judged (the one-sentence rule: 429 retry later with Retry-After, 403
retry for ever and it will not help, 503 not your fault — the 503 boot rung is the app's middleware):

1. cluster suspended by an operator      403 ``cluster_suspended``        every surface
2. tenant's schedule paused by operator  403 ``timers_paused``            "timers" only
3. storage quota reached                 403 ``storage_quota_exceeded``   every surface
4. timer-row quota reached/would exceed  403 ``timers_quota_exceeded``    "timers" only
5. period quota spent/would be exceeded  429 ``quota_exceeded``           every surface; Retry-After =
                                                                           seconds until the period resets
6. rate limit (token bucket)             429 ``rate_limited``             every surface; Retry-After =
                                                                           seconds until the tokens are there

Rate is judged last so a call refused by another rung spends no tokens. A "timers" refusal carries the
``x-queen-timers-hint`` header naming the DELETE route, which never passes through here.

Where the numbers live (all in PostgreSQL, never in a process):

- plans and switches: ``queen_tenant_plans``, ``queen_tenant_switches``, ``queen_cell_switches``;
- period usage (messages, kv ops): ``queen_usage``, written by ``metering.record`` INSIDE the writers'
  transactions; storage bytes and pending timers: ``queen_usage_gauges``, kept by statement-level
  triggers on ``queen_messages`` and ``queen_timers`` and by the KV function. Counters are slotted
  (64 rows per tenant, picked by backend pid) so concurrent writers of one tenant do not queue on a hot row;
- the rate: a token bucket row per tenant (``queen_rate_buckets``), taken with one statement per
  admitted call, refilled by the database clock. Only tenants with a rate limit pay that round trip.

Each worker keeps a cache of plan, switches, usage and gauges per tenant it serves, refreshed by one
query per ``QUEEN_LIMITS_REFRESH_MS`` for all of them (the ``limits-refresh`` loop); ``admit`` and
``plan_for`` never judge with state older than that: a tenant whose entry is older is re-read inline
first. Admin changes also NOTIFY ``queen_limits`` so every worker re-reads at once.

STALENESS BOUND: a change committed to the database (an operator switch, a plan, usage written by any
worker of any broker) is honoured by every worker's next decision at most ``QUEEN_LIMITS_REFRESH_MS``
(default 1 s) plus one query later. Quotas are therefore soft by at most what the other workers admit
within one refresh interval (each worker adds what it admitted itself to its cached usage at once).
What a worker admitted itself survives a re-read that cannot see it yet: the ops it admits while the read
runs, and the ops of requests still running when the read starts (their writes may commit after the read's
snapshot), are carried over onto the fresh usage. A request's admissions settle when its HTTP request ends
(``admission_scope``, entered by the app's middleware around every authenticated request). An op that was
in flight at a read may have committed before its snapshot, and then the carried view counts it twice;
so a quota decision that refuses on that view while such ops exist re-reads the tenant at once and
judges again without them (those still in flight at the new read): a refusal is never the effect of
the double count, and the error stays toward soft, by at most this worker's requests in flight at a read.
The rate limit and the cluster/tenant switches changed through the admin routes are not subject to the
bound in practice (the bucket is in the database; the switches are pushed by NOTIFY).

``await plan_for(broker, tenant)`` returns the tenant's effective ``Plan``: each field the minimum of the
cell default (Settings) and the tenant's own plan, which can only narrow it (for the fields where 0
means unlimited — timer rows, rate, period quota, storage — a limit is narrower than 0). A PUT of a plan that would
widen the cell is refused with 400 ``plan_widens_cell``; a cell narrowed later still wins, because the
effective value is always the minimum.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar, Token
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING

import asyncpg

from broker.config import Settings
from broker.errors import (
    TIMERS_HINT_HEADER,
    TIMERS_HINT_VALUE,
    ApiError,
    Forbidden,
    TooManyRequests,
    Unavailable,
)
from broker.metrics import LIMIT_REFUSALS
from broker.store.pool import Executor
from broker.store.queries import Q

if TYPE_CHECKING:
    from broker.auth import Principal
    from broker.context import Broker

log = logging.getLogger("queen.limits")

SURFACES = frozenset({"push", "timers", "kv_write"})
NOTIFY_CHANNEL = "queen_limits"
EVICT_AFTER_S = 600.0


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


PLAN_FIELDS = tuple(f.name for f in fields(Plan))
# Fields where 0 means "unlimited" (so any positive tenant value narrows a 0 cell value).
ZERO_UNLIMITED = frozenset({"timers_row_quota", "rate_limit_per_s", "period_quota_messages", "storage_quota_bytes"})


def cell_plan(settings: Settings) -> Plan:
    return Plan(
        timers_horizon_ms=settings.timers_horizon_ms,
        max_payload_bytes=settings.max_payload_bytes,
        timers_row_quota=settings.timers_row_quota,
        rate_limit_per_s=settings.rate_limit_per_s,
        period_quota_messages=settings.period_quota_messages,
        storage_quota_bytes=settings.storage_quota_bytes,
    )


def narrows(name: str, cell: int, mine: int) -> bool:
    """Is the tenant value ``mine`` at least as strict as the cell's ``cell``?"""
    if name in ZERO_UNLIMITED:
        if mine == 0:
            return cell == 0
        return cell == 0 or mine <= cell
    return mine <= cell


def effective(cell: Plan, stored: Mapping[str, int | None] | None) -> Plan:
    """The tenant's effective plan: per field, the stricter of the cell's and the tenant's value."""
    if not stored:
        return cell
    values: dict[str, int] = {}
    for name in PLAN_FIELDS:
        c = getattr(cell, name)
        mine = stored.get(name)
        values[name] = c if mine is None or not narrows(name, c, int(mine)) else int(mine)
    return Plan(**values)


@dataclass
class TenantState:
    plan: Plan
    timers_paused: bool = False
    messages: int = 0
    storage_bytes: int = 0
    timers_pending: int = 0
    fetched: float = float("-inf")  # monotonic time of the read this state comes from
    local_messages: int = 0  # admitted by this worker that the read may not have seen
    local_timers: int = 0
    inflight_messages: int = 0  # admitted by requests of this worker that have not ended yet
    inflight_timers: int = 0
    unsure_messages: int = 0  # the part of local_* that was in flight when the read started (may be in it)
    unsure_timers: int = 0
    last_used: float = field(default_factory=time.monotonic)


class LimitsCache:
    """The per-worker view of plans, switches and usage (see the module docstring for the bound)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.cell = cell_plan(settings)
        self.refresh_s = settings.limits_refresh_ms / 1000.0
        self.suspended = False
        self.kv_enabled = True
        self.period_left_s = float(settings.period_seconds)
        self.cell_fetched = float("-inf")
        self.tenants: dict[str, TenantState] = {}
        self._lock = asyncio.Lock()

    def stale(self, st: TenantState | None, now: float) -> bool:
        return st is None or now - st.fetched > self.refresh_s or now - self.cell_fetched > self.refresh_s

    async def get(self, pool: Executor, tenant: str) -> TenantState:
        now = time.monotonic()
        st = self.tenants.get(tenant)
        if self.stale(st, now):
            async with self._lock:
                st = self.tenants.get(tenant)
                if self.stale(st, time.monotonic()):
                    await self.refresh(pool, [tenant])
                    st = self.tenants[tenant]
        assert st is not None
        st.last_used = now
        return st

    async def refresh(self, pool: Executor, tenants: list[str]) -> None:
        """Re-read these tenants (callers hold ``self._lock``, so two reads never interleave)."""
        marks = {t: (st.local_messages, st.local_timers, st.inflight_messages, st.inflight_timers)
                 for t in tenants if (st := self.tenants.get(t)) is not None}
        started = time.monotonic()
        rows = await pool.fetch(Q.limits_state, tenants, self.settings.period_seconds)
        for r in rows:
            self.suspended = bool(r["suspended"])
            self.kv_enabled = bool(r["kv_enabled"])
            self.period_left_s = float(r["period_left_s"])
            self.cell_fetched = started
            tenant = r["tenant"]
            if tenant is None:
                continue
            stored = {name: r[name] for name in PLAN_FIELDS}
            prev = self.tenants.get(tenant)
            st = TenantState(
                plan=effective(self.cell, stored),
                timers_paused=bool(r["timers_paused"]),
                messages=int(r["messages"]),
                storage_bytes=int(r["storage_bytes"]),
                timers_pending=int(r["timers_pending"]),
                fetched=started,
                last_used=prev.last_used if prev else started,
            )
            if prev is not None:
                # carried over: admitted while the read ran, plus in flight when it started (module docstring)
                lm, lt, im, it = marks.get(tenant, (prev.local_messages, prev.local_timers, 0, 0))
                st.local_messages = max(0, prev.local_messages - lm) + im
                st.local_timers = max(0, prev.local_timers - lt) + it
                st.unsure_messages, st.unsure_timers = im, it
                st.inflight_messages, st.inflight_timers = prev.inflight_messages, prev.inflight_timers
            self.tenants[tenant] = st

    async def run(self, pool: Callable[[], asyncpg.Pool]) -> None:
        """The ``limits-refresh`` loop body (started by ``broker.services``): one query for every tenant
        served, a little more often than the bound, so requests do not find their entry stale and pay
        the read."""
        while True:
            await asyncio.sleep(self.refresh_s * 0.8)
            await self.refresh_all(pool())

    async def refresh_all(self, pool: Executor) -> None:
        now = time.monotonic()
        async with self._lock:
            for t in [t for t, st in self.tenants.items() if now - st.last_used > EVICT_AFTER_S]:
                del self.tenants[t]
            await self.refresh(pool, list(self.tenants))

    async def reread(self, pool: Executor, tenant: str) -> TenantState:
        async with self._lock:
            await self.refresh(pool, [tenant])
        return self.tenants[tenant]

    def count(self, tenant: str, st: TenantState, messages: int, timers: int) -> None:
        """Add what ``admit`` just let through to this worker's view, in flight until its request ends
        (to the tenant's current entry: a read may have replaced ``st`` while ``admit`` awaited the rate)."""
        st = self.tenants.get(tenant, st)
        st.local_messages += messages
        st.local_timers += timers
        opened = _OPEN.get()
        if opened is not None and (messages or timers):
            st.inflight_messages += messages
            st.inflight_timers += timers
            opened.append((self, tenant, messages, timers))

    def settle(self, tenant: str, messages: int, timers: int) -> None:
        st = self.tenants.get(tenant)
        if st is not None:
            st.inflight_messages = max(0, st.inflight_messages - messages)
            st.inflight_timers = max(0, st.inflight_timers - timers)

    def invalidate(self, tenant: str) -> None:
        """Forget what we know (NOTIFY from an admin change): the next decision re-reads first."""
        self.cell_fetched = float("-inf")
        if tenant == "*":
            for st in self.tenants.values():
                st.fetched = float("-inf")
        elif tenant in self.tenants:
            self.tenants[tenant].fetched = float("-inf")

    def seconds_to_period_end(self) -> float:
        return max(1.0, self.period_left_s - (time.monotonic() - self.cell_fetched))


def cache_of(broker: Broker) -> LimitsCache:
    return broker.services.limits


async def plan_for(broker: Broker, tenant: str) -> Plan:
    if broker.pool is None:
        return cell_plan(broker.settings)
    st = await cache_of(broker).get(broker.require_pool(), tenant)
    return st.plan


# Every code a limit rung refuses with (the ``code`` label of queen_limit_refusals_total, created at 0
# at boot by broker.app so a fresh dashboard reads 0 rather than "no data").
REFUSAL_CODES = ("quota_exceeded", "timers_quota_exceeded", "storage_quota_exceeded", "cluster_suspended",
                 "timers_paused", "rate_limited", "kv_disabled")


def _refuse(err: ApiError, surface: str) -> ApiError:
    LIMIT_REFUSALS.labels(err.code).inc()
    if surface == "timers":
        err.headers[TIMERS_HINT_HEADER] = TIMERS_HINT_VALUE
    return err


def _over_quota(cache: LimitsCache, tenant: str, st: TenantState, surface: str, ops: int, *,
                sure_only: bool) -> ApiError | None:
    """Rungs 4 and 5 on the cached usage; ``sure_only`` leaves out what was in flight at the read."""
    plan = st.plan
    if surface == "timers" and plan.timers_row_quota:
        pending = st.timers_pending + st.local_timers - (st.unsure_timers if sure_only else 0)
        if pending >= plan.timers_row_quota or pending + ops > plan.timers_row_quota:
            return Forbidden("timers_quota_exceeded",
                             f"tenant {tenant!r} has {pending} pending timers; {ops} more would pass the quota of "
                             f"{plan.timers_row_quota}", code="timers_quota_exceeded")
    quota = plan.period_quota_messages
    if quota:
        used = st.messages + st.local_messages - (st.unsure_messages if sure_only else 0)
        counted = ops if surface != "kv_write" else 0
        if used >= quota or used + counted > quota:
            return TooManyRequests("quota_exceeded",
                                   f"tenant {tenant!r} used {used} of {quota} messages this period"
                                   + (f"; {counted} more would pass it" if used < quota else ""),
                                   code="quota_exceeded", retry_after_s=cache.seconds_to_period_end())
    return None


async def admit(broker: Broker, principal: Principal, surface: str, ops: int) -> None:
    if surface not in SURFACES:
        raise ValueError(f"unknown limits surface {surface!r}; known: {sorted(SURFACES)}")
    ops = max(0, int(ops))
    tenant = principal.tenant
    pool = broker.require_pool()
    cache = cache_of(broker)
    st = await cache.get(pool, tenant)
    plan = st.plan

    if cache.suspended:
        raise _refuse(
            Forbidden("cluster_suspended", "the cell is suspended by an operator: produce-class work is refused",
                      code="cluster_suspended"),
            surface,
        )
    if surface == "timers" and st.timers_paused:
        raise _refuse(
            Forbidden("timers_paused", f"scheduling is paused by an operator for tenant {tenant!r}; "
                      "cancel with DELETE /api/v1/timers/:queue/*timerKey", code="timers_paused"),
            surface,
        )
    if plan.storage_quota_bytes and st.storage_bytes >= plan.storage_quota_bytes:
        raise _refuse(
            Forbidden("storage_quota_exceeded",
                      f"tenant {tenant!r} stores {st.storage_bytes} bytes; the plan allows {plan.storage_quota_bytes}",
                      code="storage_quota_exceeded"),
            surface,
        )
    err = _over_quota(cache, tenant, st, surface, ops, sure_only=False)
    if err is not None and (st.unsure_messages or st.unsure_timers):
        # the view may count ops of the last read twice (module docstring): read again, judge without them
        st = await cache.reread(pool, tenant)
        plan = st.plan
        err = _over_quota(cache, tenant, st, surface, ops, sure_only=True)
    if err is not None:
        raise _refuse(err, surface)
    if plan.rate_limit_per_s:
        wait_ms = await pool.fetchval(Q.limits_rate_take, tenant, float(max(ops, 1)), float(plan.rate_limit_per_s))
        if wait_ms:
            raise _refuse(
                TooManyRequests("kv_rate_limited" if surface == "kv_write" else "rate_limited",
                                f"tenant {tenant!r} is over its rate of {plan.rate_limit_per_s} ops/s",
                                code="rate_limited", retry_after_s=wait_ms / 1000.0),
                surface,
            )
    cache.count(tenant, st, ops if surface != "kv_write" else 0, ops if surface == "timers" else 0)


# The admissions of the current request, settled when it ends (see the module docstring).
Opened = list[tuple["LimitsCache", str, int, int]]
_OPEN: ContextVar[Opened | None] = ContextVar("queen_limits_open", default=None)
Scope = tuple[Token[Opened | None], Opened]


def open_admissions() -> Scope:
    """One request begins: what ``admit`` lets through from here is in flight until ``close_admissions``
    (the app's middleware calls the pair around every authenticated request; plain calls, not a
    generator context manager, on the hottest path there is)."""
    opened: Opened = []
    return _OPEN.set(opened), opened


def close_admissions(scope: Scope) -> None:
    """The request ended: its writes have committed or failed, so its admissions are no longer in flight."""
    token, opened = scope
    _OPEN.reset(token)
    for cache, tenant, messages, timers in opened:
        cache.settle(tenant, messages, timers)


@contextmanager
def admission_scope() -> Iterator[None]:
    """``open_admissions`` / ``close_admissions`` as a ``with`` block."""
    scope = open_admissions()
    try:
        yield
    finally:
        close_admissions(scope)


# --- operator state (the admin routes call these; every change is NOTIFYed to every worker)


async def _changed(broker: Broker, tenant: str) -> None:
    await broker.require_pool().execute(Q.limits_notify, tenant)
    cache_of(broker).invalidate(tenant)


async def stored_plan(broker: Broker, tenant: str) -> dict[str, int | None] | None:
    row = await broker.require_pool().fetchrow(Q.limits_plan_get, tenant)
    return None if row is None else {n: row[n] for n in PLAN_FIELDS}


async def store_plan(broker: Broker, tenant: str, values: Mapping[str, int | None]) -> None:
    """Replace the tenant's stored plan (callers have checked that every value narrows the cell)."""
    await broker.require_pool().execute(Q.limits_plan_put, tenant, *(values.get(n) for n in PLAN_FIELDS))
    await _changed(broker, tenant)


async def delete_plan(broker: Broker, tenant: str) -> bool:
    row = await broker.require_pool().fetchrow(Q.limits_plan_delete, tenant)
    await _changed(broker, tenant)
    return row is not None


async def timers_paused(broker: Broker, tenant: str, value: bool | None = None) -> bool:
    pool = broker.require_pool()
    if value is None:
        return bool(await pool.fetchval(Q.limits_paused_get, tenant))
    now = await pool.fetchval(Q.limits_paused_set, tenant, value)
    await _changed(broker, tenant)
    return bool(now)


async def kv_enabled(broker: Broker, value: bool | None = None) -> bool:
    """The operator's KV kill switch (cluster-wide), read or set."""
    pool = broker.require_pool()
    if value is None:
        return bool(await pool.fetchval(Q.limits_kv_enabled_get))
    now = await pool.fetchval(Q.limits_kv_enabled_set, value)
    await _changed(broker, "*")
    return bool(now)


async def check_kv_enabled(broker: Broker, tenant: str, *, in_transaction: bool) -> None:
    """Refuse every KV call while the operator has switched KV off: 503 ``kv_disabled`` on the KV
    routes (not the caller's fault), 403 ``kv_disabled`` for the transaction rider. Judged on the
    worker's cache, so within the same staleness bound as the rungs."""
    cache = cache_of(broker)
    await cache.get(broker.require_pool(), tenant)
    if cache.kv_enabled:
        return
    LIMIT_REFUSALS.labels("kv_disabled").inc()
    detail = "the KV surface is switched off by an operator"
    if in_transaction:
        raise Forbidden("kv_disabled", detail, code="kv_disabled")
    raise Unavailable("kv_disabled", detail, code="kv_disabled", retry_after_s=5)


async def cluster_suspended(broker: Broker, value: bool | None = None) -> bool:
    pool = broker.require_pool()
    if value is None:
        return bool(await pool.fetchval(Q.limits_suspended_get))
    now = await pool.fetchval(Q.limits_suspended_set, value)
    await _changed(broker, "*")
    return bool(now)
