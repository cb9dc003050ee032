"""The streams' calls of their PL/pgSQL functions (``broker/sql/functions/streams.sql``): one typed
object per call, its ``args()`` in the named query's ``$n`` order (the query names each parameter:
``p_tenant => $1``). See ``broker.timers.calls``."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from broker.log.calls import Push


@dataclass(frozen=True, slots=True)
class StreamsRegister:
    """``queen_streams_register`` (query ``streams_register``)."""

    tenant: str
    name: str
    source: str
    sink: str | None
    config_hash: str
    reset: bool  # drop the query's state (and take the new hash) instead of refusing a different hash

    def args(self) -> tuple[Any, ...]:
        return (self.tenant, self.name, self.source, self.sink, self.config_hash, self.reset)


@dataclass(frozen=True, slots=True)
class StreamsStateGet:
    """``queen_streams_state_get`` (query ``streams_state_get``)."""

    tenant: str
    query_id: uuid.UUID
    partition_id: uuid.UUID
    keys: Sequence[str]  # empty: every key
    prefix: str | None
    ripe_ms: int | None  # only values whose numeric windowEnd (epoch ms) is at or before this; None: all

    def args(self) -> tuple[Any, ...]:
        return (self.tenant, self.query_id, self.partition_id, self.keys, self.prefix, self.ripe_ms)


@dataclass(frozen=True, slots=True)
class StreamsCycle:
    """``queen_streams_cycle`` (query ``streams_cycle``): one partition's state writes, its sink pushes
    (``push``, metered: its ``meter_period_s`` must be set) and the ack of the source batch, in one
    transaction. The tenant is ``push.tenant``."""

    query_id: uuid.UUID
    partition_id: uuid.UUID
    group: str
    op_keys: Sequence[str]
    op_values: Sequence[str | None]  # JSON text; None deletes the key
    ack_txn: str | None  # a message the ack must cover (None: no ack)
    ack_lease: uuid.UUID | None
    ack_count: int | None  # the ack covers the lease's first this many messages not done yet
    release: bool  # release the lease even when messages stay under it (delivered again at once)
    push: Push

    def args(self) -> tuple[Any, ...]:
        assert self.push.meter_period_s is not None, "a stream cycle meters its pushes"
        return (self.query_id, self.partition_id, self.group, self.op_keys, self.op_values, self.ack_txn,
                self.ack_lease, self.ack_count, self.release, *self.push.args())
