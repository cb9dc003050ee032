"""The message log's calls of its hot PL/pgSQL functions (``broker/sql/functions/log.sql``): one typed
object per call (push, pop, ack), built by every caller (the service, the DLQ replay, the tests).

Each named query calls its function in PostgreSQL's named notation (``p_tenant => $1``), and the
object's ``args()`` gives the query's ``$n`` values in order, so a change of a function's parameters is
one edit here plus the query, and mypy points at every caller. Array fields are parallel: element ``i``
of each describes the same item. Field names are the function's parameter names without ``p_``.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from broker.log.parse import AckItem
from broker.store.queries import Q


@dataclass(frozen=True, slots=True)
class Push:
    """``queen_push_checked`` (query ``log_push``), or with ``meter_period_s`` ``queen_push_edge`` (query
    ``log_push_edge``: the same push, metered in the same statement, for a push that is its own
    transaction). One row per item, in item order."""

    tenant: str
    plain: Sequence[str]  # queues the caller saw not encrypting: the statement re-checks them (a race)
    queues: Sequence[str]
    partitions: Sequence[str]
    ids: Sequence[uuid.UUID]
    txns: Sequence[str]
    traces: Sequence[uuid.UUID | None]
    payloads: Sequence[bytes]
    codecs: Sequence[int]
    key_ids: Sequence[str | None]
    subs: Sequence[str | None]
    deadline_ms: Sequence[int | None]  # from now; None: no deadline
    meter_period_s: int | None = None

    @property
    def query(self) -> str:
        return Q.log_push if self.meter_period_s is None else Q.log_push_edge

    def args(self) -> tuple[Any, ...]:
        """The optional columns go as NULL when no item has a value: the function reads its arrays with
        one multi-argument ``unnest``, which pads a NULL array with NULLs, and asyncpg then encodes no
        elements for them (it type-checks every element it sends: 1,000 of them for a 100-item push,
        about a fifth of its client cost, docs/performance.md "Push")."""
        head = (self.tenant, self.plain, self.queues, self.partitions, self.ids, self.txns, _or_null(self.traces),
                self.payloads, self.codecs, _or_null(self.key_ids), _or_null(self.subs), _or_null(self.deadline_ms))
        return head if self.meter_period_s is None else (*head, self.meter_period_s)


def _or_null(values: Sequence[Any]) -> Sequence[Any] | None:
    """``values``, or None when every element is None."""
    for v in values:
        if v is not None:
            return values
    return None


@dataclass(frozen=True, slots=True)
class Pop:
    """``queen_pop`` (query ``log_pop``): up to ``batch`` messages of one queue for one group, from at most
    ``max_partitions`` partitions (or the one named), leased unless ``auto_ack``."""

    tenant: str
    queue: str
    partition: str | None
    group: str
    batch: int
    max_partitions: int
    auto_ack: bool
    sub_mode: str | None = None  # 'new': a group seen for the first time starts at now
    sub_from: datetime | None = None  # a group seen for the first time starts at this instant
    conflation: bool = False

    def args(self) -> tuple[Any, ...]:
        return (self.tenant, self.queue, self.partition, self.group, self.batch, self.max_partitions,
                self.auto_ack, self.sub_mode, self.sub_from, self.conflation)

    @staticmethod
    def many_args(tenant: str, pops: Sequence[Pop]) -> tuple[Any, ...]:
        """The ``$n`` values of query ``log_pop_many``: these pops of ``tenant`` as parallel arrays, run
        in this order in one statement; each row carries its pop's 1-based position as ``job``."""
        assert all(p.tenant == tenant for p in pops)
        return (tenant, [p.queue for p in pops], [p.partition for p in pops], [p.group for p in pops],
                [p.batch for p in pops], [p.max_partitions for p in pops], [p.auto_ack for p in pops],
                [p.sub_mode for p in pops], [p.sub_from for p in pops], [p.conflation for p in pops])


@dataclass(frozen=True, slots=True)
class Ack:
    """``queen_ack`` (query ``log_ack``): one verdict per acknowledgement, in order."""

    tenant: str
    pids: Sequence[uuid.UUID]
    txns: Sequence[str]
    statuses: Sequence[str]
    leases: Sequence[uuid.UUID | None]
    groups: Sequence[str]
    errors: Sequence[str | None]

    @classmethod
    def of(cls, tenant: str, items: Sequence[AckItem]) -> Ack:
        return cls(tenant=tenant, pids=[it.partition_id for it in items], txns=[it.txn for it in items],
                   statuses=[it.status for it in items], leases=[it.lease for it in items],
                   groups=[it.group for it in items], errors=[it.error for it in items])

    def args(self) -> tuple[Any, ...]:
        return (self.tenant, self.pids, self.txns, self.statuses, self.leases, self.groups, self.errors)
