"""Reads by offset (``queue(q).fetch()``): a partition's records from a 0-based offset, with its high
watermark and log start, without a consumer group, a lease or a cursor. One statement per call."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import orjson

from broker.log import render
from broker.payloads import Sealed, Undecryptable, open_
from broker.store.queries import Q

OFFSET_OUT_OF_RANGE = "OFFSET_OUT_OF_RANGE"
UNKNOWN_TOPIC_OR_PARTITION = "UNKNOWN_TOPIC_OR_PARTITION"
RECORDS_PER_ENTRY = 1000


@dataclass(frozen=True)
class FetchEntry:
    queue: str
    partition: str
    offset: int
    max_bytes: int


async def fetch(b: Any, tenant: str, entries: list[FetchEntry], max_bytes: int) -> dict[str, Any]:
    async with b.require_pool().acquire() as conn:
        rows = await conn.fetch(Q.reads_fetch, tenant, [e.queue for e in entries], [e.partition for e in entries],
                                [e.offset for e in entries], RECORDS_PER_ENTRY)
    by_idx: dict[int, list[Any]] = {}
    for r in rows:
        by_idx.setdefault(r["idx"], []).append(r)
    budget = max_bytes
    out: list[dict[str, Any]] = []
    for i, e in enumerate(entries, start=1):
        rs = by_idx.get(i, [])
        head = rs[0] if rs else None
        if head is None or head["pid"] is None:
            out.append({"records": [], "highWatermark": 0, "logStartOffset": 0, "error": UNKNOWN_TOPIC_OR_PARTITION})
            continue
        hw, start = int(head["hw"]), int(head["log_start"])
        entry: dict[str, Any] = {"records": [], "highWatermark": hw, "logStartOffset": start}
        if e.offset < start or e.offset > hw:
            entry["error"] = OFFSET_OUT_OF_RANGE
            out.append(entry)
            continue
        used = 0
        for r in rs:
            if r["seq"] is None:
                break
            if r["deleted_at"] is not None:  # a tombstone keeps its offset with a null payload (decisions §9)
                raw = b"null"
            else:
                opened = open_(b.codec, b.keyring, tenant, e.queue, Sealed(r["payload"], r["codec"], r["key_id"]))
                raw = b"null" if isinstance(opened, Undecryptable) else opened
            size = len(raw)
            # Each entry gets at least one record when the call still has budget; then both ceilings hold.
            if entry["records"] and (used + size > e.max_bytes or size > budget):
                break
            if not entry["records"] and budget <= 0:
                break
            record = {"offset": int(r["seq"]) - 1, "transactionId": r["txn"], "payload": orjson.Fragment(raw),
                      "ts": render.ts(r["created_at"])}
            if r["deleted_at"] is not None:
                record["deleted"] = True
            entry["records"].append(record)
            used += size
            budget -= size
        out.append(entry)
    return {"entries": out}


@dataclass(frozen=True)
class ChangedEntry:
    queue: str
    since: datetime | None
    after: uuid.UUID | None
    limit: int


async def changed(b: Any, tenant: str, entries: list[ChangedEntry]) -> dict[str, Any]:
    out: list[dict[str, Any]] = []
    safe: datetime | None = None
    async with b.require_pool().acquire() as conn:
        for e in entries:
            rows = await conn.fetch(Q.reads_changed, tenant, e.queue, e.since, e.after, e.limit + 1)
            more = len(rows) > e.limit
            rows = rows[: e.limit]
            item: dict[str, Any] = {"partitions": [
                {"name": r["name"], "id": str(r["id"]), "lastOffset": int(r["last_offset"]),
                 "logStart": int(r["log_start"]), "lastWriteAt": render.ts(r["last_push_at"])} for r in rows]}
            if more:
                item["next"] = str(rows[-1]["id"])
            out.append(item)
            for r in rows:
                safe = r["safe_time"] if safe is None else min(safe, r["safe_time"])
        if safe is None:
            safe = await conn.fetchval(Q.reads_now)
    return {"safeTime": render.ts(safe), "entries": out}
