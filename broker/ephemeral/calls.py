"""The ephemeral queues' calls of their PL/pgSQL functions (``broker/sql/functions/ephemeral.sql``) that
take more than a handful of parameters: one typed object per call, its ``args()`` in the named query's
``$n`` order (the query names each parameter: ``p_tenant => $1``). See ``broker.timers.calls``."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from broker.ephemeral.parse import Options


@dataclass(frozen=True, slots=True)
class EphConfigure:
    """``queen_eph_configure`` (query ``eph_configure``); a None option keeps the stored (or default) one."""

    tenant: str
    queue: str
    options: Options

    def args(self) -> tuple[Any, ...]:
        o = self.options
        return (self.tenant, self.queue, o.max_bytes, o.max_length, o.policy, o.ttl_s, o.lease_s, o.retry_limit,
                o.window_ms, o.window_count)


@dataclass(frozen=True, slots=True)
class EphPop:
    """``queen_eph_pop`` (query ``eph_pop``): up to ``batch`` messages for ``group``."""

    tenant: str
    queue: str
    partition: str | None  # None: any partition
    group: str
    batch: int
    auto_ack: bool

    def args(self) -> tuple[Any, ...]:
        return (self.tenant, self.queue, self.partition, self.group, self.batch, self.auto_ack)


@dataclass(frozen=True, slots=True)
class EphAck:
    """``queen_eph_ack`` (query ``eph_ack``): one outcome per acknowledgement (parallel arrays)."""

    tenant: str
    queue: str
    group: str
    tags: Sequence[str | None]
    seqs: Sequence[int | None]
    attempts: Sequence[int | None]
    statuses: Sequence[str]
    errors: Sequence[str | None]

    def args(self) -> tuple[Any, ...]:
        return (self.tenant, self.queue, self.group, self.tags, self.seqs, self.attempts, self.statuses, self.errors)
