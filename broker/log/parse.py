"""Validation of what clients send to the log routes. Pure functions: a bad value raises ``BadRequest``
(400, envelope) before anything touches the database, so a refused call changes nothing."""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, NamedTuple

import orjson

from broker.errors import BadRequest, PayloadTooLarge
from broker.ids import PARTITION_NUMBER_MAX, partition_uuid
from broker.log import QUEUE_MODE

MAX_NAME = 256
MAX_TXN = 512
MAX_DEADLINE_MS = 7 * 86_400_000
MAX_ITEMS = 10_000
DEFAULT_PARTITION = "Default"

# Item keys the server owns: supplying one is a refusal, never a silent drop.
SERVER_OWNED = ("producerSub", "messageId", "tenant")
PUSH_ITEM_KEYS = frozenset({"queue", "partition", "payload", "transactionId", "traceId", "deadlineMs"})

# Every option key the official client may send to /configure (the nine it always sends plus the
# extras it forwards), and what we do with it: leaseTime, retryLimit and the booleans are columns of
# queen_queues; the rest are kept in queen_queues.options as given, and the ones that gate delivery or
# admission (priority, delayedProcessing, windowBuffer, maxSize, retryDelay, maxWaitTimeSeconds) are
# read back as generated columns by push and pop (broker/sql/migrations/0010_queue_options.sql,
# broker/sql/functions/queue_options.sql); retentionSeconds/completedRetentionSeconds by the pruner. Every
# key is acted on: an unknown one is refused, none is stored and ignored.
OPTION_INT = {"leaseTime": (1, 86_400 * 30), "retryLimit": (0, 1_000), "priority": (-1_000_000, 1_000_000),
              "delayedProcessing": (0, 86_400 * 365), "windowBuffer": (0, 86_400 * 365),
              "maxSize": (0, 2**62), "retentionSeconds": (0, 2**31), "completedRetentionSeconds": (0, 2**31),
              "retryDelay": (0, 86_400_000), "maxWaitTimeSeconds": (0, 86_400 * 365)}
OPTION_BOOL = ("encryptionEnabled", "dlqAfterMaxRetries", "deadLetterQueue")
ACK_STATUSES = frozenset({"completed", "success", "failed", "retry", "dlq"})


class PushItem(NamedTuple):
    """One message to push. A named tuple, not a dataclass: one is built per pushed message, and a
    frozen dataclass's constructor costs three times as much (0.9 against 0.3 us)."""

    queue: str
    partition: str
    data: bytes  # the payload's JSON bytes
    txn: str | None
    trace: uuid.UUID | None
    deadline_ms: int | None
    message_id: uuid.UUID | None = None  # minted by the client (binary push with frames), else by us


@dataclass(frozen=True)
class QueueOptions:
    lease_time_s: int
    retry_limit: int
    dlq_enabled: bool
    encryption_enabled: bool
    extra: dict[str, Any]


@dataclass(frozen=True)
class AckItem:
    partition_id: uuid.UUID
    txn: str
    status: str
    lease: uuid.UUID | None
    lease_malformed: bool
    group: str
    error: str | None


_CONTROL = re.compile(r"[\x00-\x1f]")


def name(value: Any, what: str, *, default: str | None = None) -> str:
    if value is None and default is not None:
        return default
    if not isinstance(value, str) or not value:
        raise BadRequest("bad_name", f"{what} must be a non-empty string")
    if len(value) > MAX_NAME:
        raise BadRequest("bad_name", f"{what} is longer than {MAX_NAME} characters")
    if _CONTROL.search(value):
        raise BadRequest("bad_name", f"{what} contains a control character")
    return value


def opt_str(value: Any, what: str) -> str | None:
    if value is None or value == "":
        return None
    return name(value, what)


def push_items(raw: Any, *, max_payload: int, where: str = "items") -> list[PushItem]:
    if not isinstance(raw, list):
        raise BadRequest("bad_items", f"{where} must be an array of push items")
    if len(raw) > MAX_ITEMS:
        raise BadRequest("too_many_items", f"{where} holds {len(raw)} items; at most {MAX_ITEMS} per call")
    seen: set[str] = set()
    return [push_item(it, where, i, max_payload, seen) for i, it in enumerate(raw)]


def _name_once(value: Any, where: str, i: int, field: str, seen: set[str], default: str | None = None) -> str:
    """A queue or partition name, checked once per request (the names an item repeats are in ``seen``).
    The error's path (``items[3].queue``) is built only when the name is refused."""
    if isinstance(value, str) and value in seen:
        return value
    out = name(value, f"{where}[{i}].{field}", default=default)
    seen.add(out)
    return out


def push_item(it: Any, where: str, i: int, max_payload: int, seen: set[str]) -> PushItem:
    """Item ``i`` of the array at ``where``. Runs once per pushed message: every error path is built only
    when it is taken (a 100-item push spent a tenth of its request CPU here, docs/performance.md "Push")."""
    if not isinstance(it, dict):
        raise BadRequest("bad_item", f"{where}[{i}] must be an object")
    if not it.keys() <= PUSH_ITEM_KEYS:  # none of them is server-owned or starts with "_"
        for key in it:
            if key in SERVER_OWNED or key.startswith("_"):
                raise BadRequest("server_owned_field", f"{where}[{i}].{key} is set by the broker and cannot be supplied",
                                 extra={"field": key})
            if key not in PUSH_ITEM_KEYS:
                raise BadRequest("unknown_field", f"{where}[{i}].{key} is not a push item field", extra={"field": key})
    queue = _name_once(it.get("queue"), where, i, "queue", seen)
    partition = _name_once(it.get("partition"), where, i, "partition", seen, DEFAULT_PARTITION)
    if "payload" not in it:
        raise BadRequest("payload_required", f"{where}[{i}].payload is required (any JSON value, null included)")
    data = orjson.dumps(it["payload"])
    if len(data) > max_payload:
        raise PayloadTooLarge(
            "payload_too_large", f"{where}[{i}].payload is {len(data)} bytes; the plan allows {max_payload}",
            extra={"limit": max_payload},
        )
    if len(it) == 2 + ("partition" in it):  # queue and payload (checked above), no optional field: the usual item
        return PushItem(queue, partition, data, None, None, None)
    txn = it.get("transactionId")
    if txn is not None:
        txn = txn_id(txn, f"{where}[{i}].transactionId")
    trace = it.get("traceId")
    trace_id = None
    if trace is not None and trace != "":
        trace_id = parse_uuid(trace, f"{where}[{i}].traceId")
    dl = it.get("deadlineMs")
    return PushItem(queue, partition, data, txn, trace_id, None if dl is None else deadline(dl, f"{where}[{i}].deadlineMs"))


def txn_id(value: Any, what: str) -> str:
    if not isinstance(value, str) or not value or len(value) > MAX_TXN or "\x00" in value:
        raise BadRequest("bad_transaction_id", f"{what} must be a string of 1..{MAX_TXN} characters without NUL")
    return value


def deadline(value: Any, what: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0 or value > MAX_DEADLINE_MS:
        raise BadRequest("bad_deadline", f"{what} must be a positive integer of milliseconds (at most {MAX_DEADLINE_MS})")
    return value


def parse_uuid(value: Any, what: str) -> uuid.UUID:
    if not isinstance(value, str):
        raise BadRequest("bad_uuid", f"{what} must be a UUID string")
    try:
        return uuid.UUID(value)
    except ValueError:
        raise BadRequest("bad_uuid", f"{what}={value!r} is not a UUID") from None


def partition_id(value: Any, what: str) -> uuid.UUID:
    """A partition id as a client sends it back: the UUID of a JSON answer, or the decimal number a
    framed pop answer carries (docs/protocol.md §1.11), which names the same partition."""
    if isinstance(value, str) and value.isdigit() and len(value) <= 19 and value.isascii():
        number = int(value)
        if 1 <= number <= PARTITION_NUMBER_MAX:
            return partition_uuid(number)
        raise BadRequest("bad_uuid", f"{what}={value!r} is not a partition number")
    return parse_uuid(value, what)


def maybe_uuid(value: Any) -> uuid.UUID | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        return uuid.UUID(value)
    except ValueError:
        return None


def queue_options(raw: Any, current: QueueOptions | None = None) -> QueueOptions:
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise BadRequest("bad_options", "options must be an object")
    extra: dict[str, Any] = dict(current.extra) if current else {}
    lease = current.lease_time_s if current else 300
    retry = current.retry_limit if current else 3
    dlq = current.dlq_enabled if current else True
    enc = current.encryption_enabled if current else False
    for key, value in raw.items():
        if key not in OPTION_INT and key not in OPTION_BOOL:  # before the null check: no key is silently dropped
            raise BadRequest("unknown_option", f"options.{key} is not a queue option this broker knows", extra={"option": key})
        if value is None:
            continue
        if key in OPTION_INT:
            lo, hi = OPTION_INT[key]
            if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
                raise BadRequest("bad_option", f"options.{key} must be an integer in [{lo}, {hi}]", extra={"option": key})
            if key == "leaseTime":
                lease = value
            elif key == "retryLimit":
                retry = value
            else:
                extra[key] = value
        elif key in OPTION_BOOL:
            if not isinstance(value, bool):
                raise BadRequest("bad_option", f"options.{key} must be true or false", extra={"option": key})
            if key == "encryptionEnabled":
                enc = value
            elif key == "dlqAfterMaxRetries":
                dlq = value
            else:
                # deadLetterQueue: false turns dead-lettering off like dlqAfterMaxRetries: false (a message
                # out of retries is then dropped as done); both must allow it for the DLQ to be used.
                extra[key] = value
    if extra.get("deadLetterQueue") is False:
        dlq = False
    wait, delay = extra.get("maxWaitTimeSeconds") or 0, extra.get("delayedProcessing") or 0
    if wait and delay >= wait:
        # Every message would be dead-lettered for waiting too long before it may even be delivered.
        raise BadRequest(
            "conflicting_options",
            f"options.delayedProcessing={delay} holds every message at least as long as "
            f"options.maxWaitTimeSeconds={wait} allows it to wait: no message could ever be delivered",
            extra={"option": "maxWaitTimeSeconds"},
        )
    return QueueOptions(lease, retry, dlq, enc, extra)


def ack_item(raw: Any, where: str, default_group: str | None, memo: dict[Any, Any] | None = None) -> AckItem:
    """One acknowledgement. ``memo`` (shared by the items of one call) remembers partition ids and
    group names already checked: a batch ack repeats the same few."""
    if not isinstance(raw, dict):
        raise BadRequest("bad_ack", f"{where} must be an object")
    memo = {} if memo is None else memo
    txn = txn_id(raw.get("transactionId"), f"{where}.transactionId")
    raw_pid = raw.get("partitionId")
    pid = memo.get(raw_pid) if isinstance(raw_pid, str) else None
    if pid is None:
        pid = partition_id(raw_pid, f"{where}.partitionId")
        memo[raw_pid] = pid
    status = raw.get("status", "completed")
    if status is True:
        status = "completed"
    elif status is False:
        status = "failed"
    if not isinstance(status, str) or status not in ACK_STATUSES:  # a list or object is unhashable
        raise BadRequest("bad_status", f"{where}.status must be one of {sorted(ACK_STATUSES)}")
    lease_raw = raw.get("leaseId")
    lease = maybe_uuid(lease_raw)
    malformed = lease is None and lease_raw not in (None, "")
    group = raw.get("consumerGroup") or default_group or QUEUE_MODE
    if not isinstance(group, str) or ("group", group) not in memo:  # a list or object is unhashable
        name(group, f"{where}.consumerGroup")
        memo[("group", group)] = True
    err = raw.get("error")
    if err is not None and not isinstance(err, str):
        err = orjson.dumps(err).decode()
    if err is not None:
        err = err.replace("\x00", "")[:4000]
    return AckItem(pid, txn, status, lease, malformed, group, err)


def timestamp(value: str, what: str) -> datetime:
    """An ISO-8601 instant, returned in UTC. One that exists only in its own offset (9999-12-31T23:59
    at -14:00 is year 10000 in UTC, 0001-01-01 at +14:00 is year 0) cannot be sent to the database
    and is refused here, like a malformed one."""
    try:
        ts = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise BadRequest("bad_timestamp", f"{what}={value!r} is not an ISO-8601 timestamp") from None
    if ts.tzinfo is None:
        ts = ts.replace(tzinfo=UTC)
    try:
        return ts.astimezone(UTC)
    except OverflowError:
        raise BadRequest("bad_timestamp", f"{what}={value!r} is outside the years 1-9999 in UTC") from None
