"""Validation of the ephemeral wire (pure, no I/O). Every refusal is a 400 naming the field; an option
this broker does not know is refused, never dropped."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from broker.errors import BadRequest
from broker.log.parse import DEFAULT_PARTITION, MAX_ITEMS, name

__all__ = ["DEFAULT_PARTITION", "MAX_ITEMS", "Ack", "Options", "acks", "options", "payloads"]

# option -> (low, high): the accepted range of each integer option.
INT_OPTIONS = {
    "maxBytes": (1, 2**40),
    "maxLength": (1, 10_000_000),
    "ttlSeconds": (0, 86_400 * 365),
    "leaseSeconds": (1, 86_400),
    "retryLimit": (0, 1_000),
}
WINDOW_LIMITS = {"ms": (0, 60_000), "count": (0, MAX_ITEMS)}
POLICIES = ("reject", "dropOldest")
OPTION_KEYS = frozenset({*INT_OPTIONS, "policy", "windowBuffer"})
ACK_STATUSES = ("completed", "failed", "retry")
ACK_KEYS = frozenset({"id", "status", "error"})
MAX_ERROR = 4096


@dataclass(frozen=True)
class Options:
    max_bytes: int | None = None
    max_length: int | None = None
    policy: str | None = None
    ttl_s: int | None = None
    lease_s: int | None = None
    retry_limit: int | None = None
    window_ms: int | None = None
    window_count: int | None = None


@dataclass(frozen=True)
class Ack:
    """One parsed ack: ``tag``/``seq``/``attempt`` come from the id (``None`` when the id is not one
    this broker minted: the answer is then ``unknown`` without asking the database)."""

    id: str
    tag: str | None
    seq: int | None
    attempt: int | None
    status: str
    error: str | None


def _int(value: Any, what: str, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadRequest("bad_option", f"{what} must be an integer", extra={"option": what})
    if not lo <= value <= hi:
        raise BadRequest("bad_option", f"{what} must be between {lo} and {hi}", extra={"option": what})
    return value


def options(raw: Any) -> Options:
    if raw is None:
        return Options()
    if not isinstance(raw, dict):
        raise BadRequest("bad_options", "options must be an object")
    for key in raw:
        if key not in OPTION_KEYS:
            raise BadRequest("unknown_option", f"{key!r} is not an ephemeral queue option; known: "
                             + ", ".join(sorted(OPTION_KEYS)), extra={"option": key})
    # An option left out keeps its value; one given must be valid (null is not a value: refused, as the
    # schema says, never read as "left out").
    ints = {k: _int(raw[k], k, *INT_OPTIONS[k]) if k in raw else None for k in INT_OPTIONS}
    policy = raw.get("policy")
    if "policy" in raw and policy not in POLICIES:
        raise BadRequest("bad_option", "policy must be 'reject' or 'dropOldest'", extra={"option": "policy"})
    window: dict[str, int | None] = {"ms": None, "count": None}
    if "windowBuffer" in raw:
        wb = raw["windowBuffer"]
        if not isinstance(wb, dict) or set(wb) - set(WINDOW_LIMITS):
            raise BadRequest("bad_option", "windowBuffer must be an object {ms?, count?}",
                             extra={"option": "windowBuffer"})
        for k, (lo, hi) in WINDOW_LIMITS.items():
            window[k] = _int(wb[k], f"windowBuffer.{k}", lo, hi) if k in wb else 0
    return Options(ints["maxBytes"], ints["maxLength"], policy, ints["ttlSeconds"], ints["leaseSeconds"],
                   ints["retryLimit"], window["ms"], window["count"])


def payloads(raw: Any, *, max_payload: int) -> list[str]:
    """The messages of a push as JSON texts (``{"payload": ...}`` each, nothing else)."""
    if not isinstance(raw, list):
        raise BadRequest("bad_messages", "messages must be an array of {\"payload\": ...}")
    if len(raw) > MAX_ITEMS:
        raise BadRequest("too_many_items", f"messages holds {len(raw)} items; at most {MAX_ITEMS} per call")
    out: list[str] = []
    for i, m in enumerate(raw):
        if not isinstance(m, dict) or "payload" not in m or set(m) != {"payload"}:
            raise BadRequest("bad_message", f"messages[{i}] must be an object with exactly one key, payload")
        text = orjson.dumps(m["payload"])
        if b"\\u0000" in text:
            raise BadRequest("bad_payload", f"messages[{i}].payload contains a NUL character in a string, which "
                             "cannot be stored", extra={"index": i})
        if len(text) > max_payload:
            raise BadRequest("payload_too_large", f"messages[{i}].payload is {len(text)} bytes; "
                             f"at most {max_payload}", extra={"index": i})
        out.append(text.decode())
    return out


def message_id(tag: str, seq: int, attempt: int) -> str:
    """The opaque id of one delivery: incarnation tag, message number, delivery attempt."""
    return f"{tag}.{seq}.{attempt}"


def _split_id(value: str) -> tuple[str | None, int | None, int | None]:
    parts = value.split(".")
    if len(parts) != 3 or not all(p.isascii() and p.isalnum() for p in parts) or not parts[1].isdigit() \
            or not parts[2].isdigit():
        return None, None, None
    seq, attempt = int(parts[1]), int(parts[2])
    if seq >= 2**63 or attempt >= 2**31:
        return None, None, None
    return parts[0], seq, attempt


def acks(raw: Any) -> list[Ack]:
    if not isinstance(raw, list):
        raise BadRequest("bad_acks", "acks must be an array of {id, status?, error?}")
    if len(raw) > MAX_ITEMS:
        raise BadRequest("too_many_items", f"acks holds {len(raw)} items; at most {MAX_ITEMS} per call")
    out: list[Ack] = []
    for i, a in enumerate(raw):
        where = f"acks[{i}]"
        if not isinstance(a, dict):
            raise BadRequest("bad_ack", f"{where} must be an object")
        extra = set(a) - ACK_KEYS
        if extra:
            raise BadRequest("unknown_field", f"{where}.{sorted(extra)[0]} is not an ack field")
        mid = a.get("id")
        if not isinstance(mid, str) or not mid or len(mid) > 256:
            raise BadRequest("bad_ack", f"{where}.id must be a non-empty string (the popped message's id)")
        status = a.get("status")
        status = "completed" if status is None else status
        if status not in ACK_STATUSES:
            raise BadRequest("bad_ack_status", f"{where}.status must be one of {', '.join(ACK_STATUSES)}")
        error = a.get("error")
        if error is not None and (not isinstance(error, str) or len(error) > MAX_ERROR or "\x00" in error):
            raise BadRequest("bad_ack", f"{where}.error must be a string of at most {MAX_ERROR} characters, "
                             "without NUL")
        out.append(Ack(mid, *_split_id(mid), status=status, error=error))
    return out


def queue(value: Any) -> str:
    return name(value, "queue")
