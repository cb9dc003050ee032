"""Wire shapes of the log routes, one function per shape."""

from __future__ import annotations

import base64
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson

from broker.payloads import Undecryptable

_ZERO = timedelta(0)


def ts(value: datetime | None) -> str | None:
    """``YYYY-MM-DDTHH:MM:SS.mmmZ`` (UTC, milliseconds), the format the client parses."""
    if value is None:
        return None
    if value.utcoffset() != _ZERO:
        value = value.astimezone(UTC)
    return value.isoformat(timespec="milliseconds")[:-6] + "Z"  # an aware UTC value ends in "+00:00"


def data_fields(opened: bytes | Undecryptable) -> dict[str, Any]:
    """The ``data`` of a delivered message: the stored JSON embedded as is (no re-parse), or null and
    the reason when it cannot be decrypted (key removed from the ring, corrupt bytes)."""
    if isinstance(opened, Undecryptable):
        return {"data": None, "undecryptable": True, "decryptError": opened.reason, "keyId": opened.key_id}
    return {"data": orjson.Fragment(opened)}


def checked_data_fields(opened: bytes | Undecryptable) -> dict[str, Any]:
    """Like ``data_fields`` for rows that may hold bytes that are not JSON (a timer dead-lettered because
    its payload was not JSON): such bytes come back base64 under ``payloadBase64`` with ``data: null``."""
    if isinstance(opened, Undecryptable):
        return data_fields(opened)
    try:
        return {"data": orjson.loads(opened)}
    except orjson.JSONDecodeError:
        return {"data": None, "notJson": True, "payloadBase64": base64.b64encode(opened).decode()}


def push_result(i: int, item_queue: str, txn: str, row: Any) -> dict[str, Any]:
    if row["status"] == "failed":  # refused, nothing written (a full queue: broker/log/service.refused_full)
        return {"index": i, "transaction_id": txn, "queueName": item_queue, "status": "failed",
                "error": row["error"], "reason": row["reason"], "maxSize": row["maxSize"]}
    return {
        "index": i,
        "message_id": str(row["message_id"]),
        "transaction_id": txn,
        "partition_id": str(row["partition_id"]),
        "queueName": item_queue,
        "status": row["status"],
    }


def queue_row(r: Any) -> dict[str, Any]:
    out = {
        "name": r["name"],
        "namespace": r["namespace"],
        "task": r["task"],
        "options": {
            "leaseTime": r["lease_time_s"],
            "retryLimit": r["retry_limit"],
            "dlqAfterMaxRetries": r["dlq_enabled"],
            "encryptionEnabled": r["encryption_enabled"],
            **(r["options"] or {}),
        },
        "createdAt": ts(r["created_at"]),
        "updatedAt": ts(r["updated_at"]),
    }
    return out
