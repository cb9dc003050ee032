"""Validation of the streams routes' bodies. Pure functions: a bad value raises ``BadRequest`` (400,
envelope) before anything touches the database, so a refused call changes nothing. Every field the
official client sends is read; any other field is refused, never ignored."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

import orjson

from broker.errors import BadRequest, PayloadTooLarge
from broker.log import QUEUE_MODE, parse
from broker.log.parse import PushItem

MAX_HASH = 256
MAX_KEY = 1024
MAX_STATE_OPS = 10_000
MAX_KEYS = 10_000
MAX_RIPE_MS = 2**62
ACK_STATUSES = frozenset({"completed", "success"})

REGISTER_KEYS = frozenset({"name", "source_queue", "sink_queue", "config_hash", "reset"})
CYCLE_KEYS = frozenset({"query_id", "partition_id", "consumer_group", "state_ops", "push_items", "ack",
                        "release_lease"})
ACK_KEYS = frozenset({"transactionId", "leaseId", "status", "count"})
STATE_GET_KEYS = frozenset({"query_id", "partition_id", "keys", "key_prefix", "ripe_at_or_before"})


@dataclass(frozen=True)
class Registration:
    name: str
    source_queue: str
    sink_queue: str | None
    config_hash: str
    reset: bool


@dataclass(frozen=True)
class Ack:
    txn: str
    lease: uuid.UUID | None  # None: absent or not a UUID; the cycle refuses it like the log's ack does
    count: int


@dataclass(frozen=True)
class Cycle:
    query_id: uuid.UUID
    partition_id: uuid.UUID
    group: str
    op_keys: list[str] = field(default_factory=list)
    op_values: list[str | None] = field(default_factory=list)  # JSON text; None = delete
    pushes: list[PushItem] = field(default_factory=list)
    ack: Ack | None = None
    release_lease: bool = True


@dataclass(frozen=True)
class StateQuery:
    query_id: uuid.UUID
    partition_id: uuid.UUID
    keys: list[str]
    prefix: str | None
    ripe_at_or_before: int | None


def _only(body: dict[str, Any], allowed: frozenset[str], where: str = "") -> None:
    for key in body:
        if key not in allowed:
            raise BadRequest("unknown_field", f"{where}{key!r} is not a field of this request", extra={"field": key})


def _bool(value: Any, what: str, default: bool) -> bool:
    if value is None:
        return default
    if not isinstance(value, bool):
        raise BadRequest("bad_boolean", f"{what} must be true or false")
    return value


def _key(value: Any, what: str) -> str:
    """A state key: 1..MAX_KEY bytes of UTF-8 (bytes, not characters: the key is in an index), no NUL."""
    if not isinstance(value, str) or not value or "\x00" in value or len(value.encode("utf-8", "surrogatepass")) > MAX_KEY:
        raise BadRequest("bad_state_key", f"{what} must be a string of 1..{MAX_KEY} bytes of UTF-8 without NUL")
    return value


def _count(value: Any, what: str, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1 or value > hi:
        raise BadRequest("bad_count", f"{what} must be an integer in 1..{hi}")
    return value


def registration(body: dict[str, Any]) -> Registration:
    _only(body, REGISTER_KEYS)
    h = body.get("config_hash")
    if not isinstance(h, str) or not h or len(h) > MAX_HASH or "\x00" in h:
        raise BadRequest("bad_config_hash", f"config_hash must be a string of 1..{MAX_HASH} characters")
    return Registration(
        name=parse.name(body.get("name"), "name"),
        source_queue=parse.name(body.get("source_queue"), "source_queue"),
        sink_queue=parse.opt_str(body.get("sink_queue"), "sink_queue"),
        config_hash=h,
        reset=_bool(body.get("reset"), "reset", False),
    )


def _target(body: dict[str, Any]) -> tuple[uuid.UUID, uuid.UUID]:
    """The query id, and the source partition's id as the pop answer gave it (a UUID, or the decimal
    number of a framed pop answer, which names the same partition)."""
    return parse.parse_uuid(body.get("query_id"), "query_id"), parse.partition_id(body.get("partition_id"), "partition_id")


def _ack(raw: Any) -> Ack | None:
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise BadRequest("bad_ack", "ack must be an object or null")
    _only(raw, ACK_KEYS, "ack.")
    status = raw.get("status", "completed")
    if not isinstance(status, str) or status not in ACK_STATUSES:
        raise BadRequest("bad_ack_status", "ack.status must be 'completed': a cycle only completes its source batch")
    return Ack(
        txn=parse.txn_id(raw.get("transactionId"), "ack.transactionId"),
        lease=parse.maybe_uuid(raw.get("leaseId")),
        count=_count(raw.get("count"), "ack.count", parse.MAX_ITEMS),
    )


def _array(body: dict[str, Any], name: str, hi: int) -> list[Any]:
    """``body[name]`` as a list (absent or null = empty) of at most ``hi`` entries."""
    raw = body.get(name)
    raw = [] if raw is None else raw
    if not isinstance(raw, list):
        raise BadRequest(f"bad_{name}", f"{name} must be an array")
    if len(raw) > hi:
        raise BadRequest(f"too_many_{name}", f"{name} holds {len(raw)} entries; at most {hi}")
    return raw


def cycle(body: dict[str, Any], max_payload: int) -> Cycle:
    _only(body, CYCLE_KEYS)
    query_id, partition_id = _target(body)
    raw_ops = _array(body, "state_ops", MAX_STATE_OPS)
    keys: list[str] = []
    values: list[str | None] = []
    for i, op in enumerate(raw_ops):
        where = f"state_ops[{i}]"
        if not isinstance(op, dict):
            raise BadRequest("bad_state_op", f"{where} must be an object")
        kind = op.get("type")
        if kind == "upsert":
            _only(op, frozenset({"type", "key", "value"}), f"{where}.")
            if "value" not in op:
                raise BadRequest("value_required", f"{where}.value is required for an upsert (any JSON, null included)")
            try:
                text = orjson.dumps(op["value"])
            except TypeError:  # an integer beyond 64 bits (never from a parsed body: orjson reads those as floats)
                raise BadRequest("bad_state_value", f"{where}.value cannot be stored as JSON") from None
            if b"\\u0000" in text:  # jsonb cannot hold NUL in a string
                raise BadRequest("bad_state_value", f"{where}.value contains a NUL character in a string, which cannot be stored")
            if len(text) > max_payload:
                raise PayloadTooLarge("state_value_too_large",
                                      f"{where}.value is {len(text)} bytes; the plan allows {max_payload}",
                                      extra={"limit": max_payload})
            values.append(text.decode())
        elif kind == "delete":
            _only(op, frozenset({"type", "key"}), f"{where}.")
            values.append(None)
        else:
            raise BadRequest("bad_state_op_type", f"{where}.type must be 'upsert' or 'delete'")
        keys.append(_key(op.get("key"), f"{where}.key"))
    raw_items = body.get("push_items")
    pushes = [] if raw_items is None else parse.push_items(raw_items, max_payload=max_payload, where="push_items")
    return Cycle(
        query_id=query_id,
        partition_id=partition_id,
        group=parse.name(None if body.get("consumer_group") == "" else body.get("consumer_group"), "consumer_group",
                         default=QUEUE_MODE),
        op_keys=keys,
        op_values=values,
        pushes=pushes,
        ack=_ack(body.get("ack")),
        release_lease=_bool(body.get("release_lease"), "release_lease", True),
    )


def state_query(body: dict[str, Any]) -> StateQuery:
    _only(body, STATE_GET_KEYS)
    query_id, partition_id = _target(body)
    raw = _array(body, "keys", MAX_KEYS)
    prefix = body.get("key_prefix")
    if prefix is not None and (not isinstance(prefix, str) or len(prefix) > MAX_KEY or "\x00" in prefix):
        raise BadRequest("bad_key_prefix", f"key_prefix must be a string of at most {MAX_KEY} characters without NUL")
    ripe = body.get("ripe_at_or_before")
    if ripe is not None and (isinstance(ripe, bool) or not isinstance(ripe, int) or abs(ripe) > MAX_RIPE_MS):
        raise BadRequest("bad_ripe_at_or_before", "ripe_at_or_before must be an integer (epoch milliseconds)")
    return StateQuery(
        query_id=query_id,
        partition_id=partition_id,
        keys=[_key(k, f"keys[{i}]") for i, k in enumerate(raw)],
        prefix=prefix or None,
        ripe_at_or_before=ripe,
    )
