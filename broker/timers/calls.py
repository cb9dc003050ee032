"""The timers' calls of their PL/pgSQL functions (``broker/sql/functions/timers.sql``): one typed object
per call, built by every caller (the service, the sweeper, the tests).

Each named query calls its function in PostgreSQL's named notation (``p_tenant => $1``), and the object's
``args()`` gives the query's ``$n`` values in order. A change of a function's parameters is then one
edit here (a field and its place in ``args()``) plus the query, and mypy points at every caller that
builds the object the old way. The field names are the function's parameter names without their prefix.

Arrays are parallel: element ``i`` of every array field describes the same row. ``None`` for a whole
array means "NULL for every row" where the function reads it so (noted on the field).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from broker.store.queries import Q


@dataclass(frozen=True, slots=True)
class Retry:
    """How a failed fire is retried: a permanent failure spends one of ``max_attempts`` (then the DLQ);
    every failure backs off ``backoff_base_ms`` doubling per attempt, at most ``backoff_cap_ms``."""

    max_attempts: int
    backoff_base_ms: int
    backoff_cap_ms: int

    def args(self) -> tuple[int, int, int]:
        return (self.max_attempts, self.backoff_base_ms, self.backoff_cap_ms)


@dataclass(frozen=True, slots=True)
class TimersApply:
    """``queen_timers_apply``: schedule / reschedule / cancel operations, one array element per operation
    (the operation-only fields of a cancel are None). With ``meter_period_s`` the same statement also
    meters the promises made (query ``timers_schedule``), else query ``timers_apply``."""

    tenant: str
    sub: str
    check_switch: bool  # refuse when scheduling is switched off (the operator's switch)
    near_ms: int  # NOTIFY queen_timers for a schedule due within this many ms; -1: never
    ops: Sequence[str]
    queues: Sequence[str]
    keys: Sequence[str]
    partitions: Sequence[str | None] | None  # None: the default partition for all
    txns: Sequence[str | None]
    ids: Sequence[uuid.UUID | str | None]
    payloads: Sequence[bytes | None]
    zstd: Sequence[bool | None] | None  # None: no payload is zstd
    key_ids: Sequence[str | None] | None  # None: nothing sealed at schedule
    delays_ms: Sequence[int | None]
    ready: Sequence[bool | None]  # the payload is judged fit for the log as stored (fired without a pack)
    meter_period_s: int | None = None

    @property
    def query(self) -> str:
        return Q.timers_apply if self.meter_period_s is None else Q.timers_schedule

    def args(self) -> tuple[Any, ...]:
        head = (self.tenant, self.sub, self.check_switch, self.near_ms, self.ops, self.queues, self.keys,
                self.partitions, self.txns, self.ids, self.payloads, self.zstd, self.key_ids, self.delays_ms,
                self.ready)
        return head if self.meter_period_s is None else (*head, self.meter_period_s)


@dataclass(frozen=True, slots=True)
class TimersTake:
    """``queen_timers_take``: up to ``batch`` due rows, whole partitions, locked until the transaction ends
    (query ``timers_take``)."""

    batch: int
    cursor: str | None  # the tenant the previous cycle's walk ended on (the walk rotates from it)
    faults: bool  # honour the test hooks' injected faults
    slice_cap: int  # most rows per tenant while several tenants are due

    def args(self) -> tuple[Any, ...]:
        return (self.batch, self.cursor, self.faults, self.slice_cap)


@dataclass(frozen=True, slots=True)
class TimersSweep:
    """``queen_timers_sweep``: one cycle's take, and its fire when every row taken is ready (query
    ``timers_sweep``)."""

    take: TimersTake
    retry: Retry
    in_tx: bool  # the statement runs inside the caller's transaction (rows to pack come back 'taken')

    def args(self) -> tuple[Any, ...]:
        return (*self.take.args(), *self.retry.args(), self.in_tx)


@dataclass(frozen=True, slots=True)
class TimersLease:
    """``queen_timers_lease``: stamp a lease (``token``, ``lease_ms`` from now) on rows taken in this
    transaction, so they stay held after its commit (query ``timers_lease``)."""

    token: uuid.UUID
    lease_ms: int
    claimed_by: str
    tenants: Sequence[str]
    queues: Sequence[str]
    keys: Sequence[str]
    ids: Sequence[uuid.UUID]

    def args(self) -> tuple[Any, ...]:
        return (self.token, self.lease_ms, self.claimed_by, self.tenants, self.queues, self.keys, self.ids)


@dataclass(frozen=True, slots=True)
class TimersFire:
    """``queen_timers_fire``: fire the good rows (``g_*``) and fail the others (``f_*``) (query
    ``timers_fire``). With ``token`` None the rows were taken in the caller's open transaction and are
    found by ctid and message id; with a token they are the rows leased under it, found by key (their
    ids and ctids are then not sent)."""

    token: uuid.UUID | None
    g_tenants: Sequence[str]
    g_queues: Sequence[str]
    g_keys: Sequence[str]
    g_ids: Sequence[uuid.UUID | None] | None
    g_tids: Sequence[Any] | None
    g_payloads: Sequence[bytes | None]  # None: the stored bytes are already the log's bytes
    g_codecs: Sequence[int]
    f_tenants: Sequence[str]
    f_queues: Sequence[str]
    f_keys: Sequence[str]
    f_ids: Sequence[uuid.UUID | None] | None
    f_errors: Sequence[str]
    f_costs: Sequence[int]  # attempts spent: 1 permanent, 0 transient
    f_wrap: Sequence[bool]  # the payload itself is the failure: the DLQ keeps it inside a JSON envelope
    retry: Retry

    def args(self) -> tuple[Any, ...]:
        return (self.token, self.g_tenants, self.g_queues, self.g_keys, self.g_ids, self.g_tids, self.g_payloads,
                self.g_codecs, self.f_tenants, self.f_queues, self.f_keys, self.f_ids, self.f_errors, self.f_costs,
                self.f_wrap, *self.retry.args())
