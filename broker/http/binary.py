"""The official client's binary wire formats (docs/protocol.md §1.9-1.11), decoded and encoded here only.

- ``QPB1``, the binary push body (``Content-Type: application/x-queen-push`` on ``POST /api/v1/push``),
  becomes the same ``PushItem`` list the JSON body does, so both feed one ``LogService.push`` call.
- ``QTB1``, the binary transaction body (same content type on ``POST /api/v1/transaction``): a JSON
  head (the bundle without its pushes) and the pushes as groups of frames.
- ``QPF1``, the framed pop answer (``frames=true`` on a pop), encoded from the JSON answer dict, so
  it carries exactly what the JSON answer does; an answer it cannot carry stays JSON.

Every integer is little-endian. A body that does not parse whole (truncated, wrong magic, lengths
past the end, trailing bytes, unknown flags) is refused with 400 ``bad_binary_body`` before anything
is stored; a declared size over what the broker accepts is 413.
"""

from __future__ import annotations

import struct
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import orjson
import zstandard
from aiohttp import web

from broker.codec import MAX_DECOMPRESSED
from broker.errors import BadRequest, PayloadTooLarge
from broker.http.wire import MAX_JSON_DEPTH, parse_json, too_deep
from broker.ids import partition_number
from broker.log import parse
from broker.log.parse import PushItem

PUSH_TYPE = "application/x-queen-push"
POP_TYPE = "application/x-queen-pop"

PUSH_MAGIC = b"QPB1"
TX_MAGIC = b"QTB1"
POP_MAGIC = b"QPF1"

F_ZSTD = 1  # the body after the flags is one zstd frame of u32 raw_len bytes
F_COUNTS = 2  # answer with counts instead of one result per item
F_TXN = 4  # every item carries its transaction id
F_FRAMES = 8  # each group is one zstd frame of stored-message frames
PUSH_FLAGS = F_ZSTD | F_COUNTS | F_TXN | F_FRAMES
TX_FLAGS = F_COUNTS

FRAME_TRACE = 1  # a frame carries a 16-byte trace id after its message id
FRAME_PRODUCER = 2  # a frame carries the producer (pop answers only: producers are server-stamped)

# A payload sits three levels down in a JSON push ({"items": [{"payload": ...}]}): the same ceiling here.
PAYLOAD_DEPTH = MAX_JSON_DEPTH - 3

_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_I64 = struct.Struct("<q")
_EPOCH = datetime(1970, 1, 1).toordinal()
_INFLATE = zstandard.ZstdDecompressor()  # one per worker process: the event loop uses it one call at a time


def is_binary(request: web.Request) -> bool:
    return "Content-Type" in request.headers and request.content_type == PUSH_TYPE


def _bad(detail: str) -> BadRequest:
    return BadRequest("bad_binary_body", f"binary body: {detail}")


class _Reader:
    """Little-endian fields off a body; reading past the end is a 400, never an IndexError."""

    __slots__ = ("data", "at")

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.at = 0

    def left(self) -> int:
        return len(self.data) - self.at

    def take(self, n: int, what: str) -> bytes:
        end = self.at + n
        if end > len(self.data):
            raise _bad(f"truncated in {what} (needs {n} bytes, {self.left()} left)")
        out = self.data[self.at:end]
        self.at = end
        return out

    def num(self, layout: struct.Struct, what: str) -> int:
        if self.at + layout.size > len(self.data):
            raise _bad(f"truncated in {what}")
        value: int = layout.unpack_from(self.data, self.at)[0]
        self.at += layout.size
        return value

    def text(self, what: str) -> str:
        raw = self.take(self.num(_U16, what), what)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise _bad(f"{what} is not UTF-8") from None

    def end(self, what: str) -> None:
        if self.left():
            raise _bad(f"{self.left()} bytes after the {what}")


class _Budget:
    """What one body may decompress to in all, and how many items it may hold (a bomb stops here)."""

    def __init__(self) -> None:
        self.bytes = MAX_DECOMPRESSED
        self.items = parse.MAX_ITEMS

    def inflate(self, z: bytes, declared: int | None, what: str) -> bytes:
        try:
            size = zstandard.frame_content_size(z)
        except zstandard.ZstdError:
            size = -2
        if size < 0:
            raise _bad(f"{what} is not a zstd frame that states its content size")
        if declared is not None and size != declared:
            raise _bad(f"{what} holds {size} bytes, the body declares {declared}")
        if size > self.bytes:
            raise PayloadTooLarge("body_too_large", f"{what} decompresses to {size} bytes; at most {MAX_DECOMPRESSED} per body")
        try:
            raw = _INFLATE.decompress(z, max_output_size=size)
        except zstandard.ZstdError as exc:
            raise _bad(f"{what}: {exc}") from None
        if len(raw) != size:
            raise _bad(f"{what} decompresses to {len(raw)} bytes, not the {size} it states")
        self.bytes -= size
        return raw

    def count(self, n: int, at_least: int, r: _Reader, what: str) -> None:
        if n > self.items:
            raise BadRequest("too_many_items", f"the body holds more than {parse.MAX_ITEMS} items")
        if n * at_least > r.left():
            raise _bad(f"{what} declares {n} items, more than its bytes can hold")
        self.items -= n


def _payload(raw: bytes, where: str, max_payload: int) -> bytes:
    if len(raw) > max_payload:
        raise PayloadTooLarge("payload_too_large", f"{where} is {len(raw)} bytes; the plan allows {max_payload}",
                              extra={"limit": max_payload})
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise _bad(f"{where} is not one JSON document: {exc}") from None
    if raw.count(b"[") + raw.count(b"{") > PAYLOAD_DEPTH and too_deep(value, PAYLOAD_DEPTH):
        raise BadRequest("json_too_deep", f"{where} nests arrays/objects more than {PAYLOAD_DEPTH} levels deep")
    return raw


def _frames(raw: bytes, n: int, queue: str, partition: str, where: str, max_payload: int) -> list[PushItem]:
    """The n stored-message frames of one group: ``u32 len | u8 flags | u8[16] id | [u8[16] trace]
    | u16 len, txn | payload``. The id must be a version-7 UUID (the client mints those)."""
    at, end, out = 0, len(raw), []
    for i in range(n):
        if at + 4 > end:
            raise _bad(f"{where} holds fewer than its {n} frames")
        start = at + 4
        stop = start + _U32.unpack_from(raw, at)[0]
        if stop > end or stop - start < 19:
            raise _bad(f"{where} frame {i} is longer than its group, or shorter than its header")
        flags = raw[start]
        if flags & ~FRAME_TRACE:
            raise _bad(f"{where} frame {i} has flags {flags} (only 1, a trace id, may come from a producer)")
        if raw[start + 7] >> 4 != 7 or raw[start + 9] & 0xC0 != 0x80:
            raise BadRequest("bad_message_id", f"{where} frame {i}: the message id is not a version-7 UUID")
        mid = uuid.UUID(bytes=raw[start + 1:start + 17])
        cur, trace = start + 17, None
        if flags & FRAME_TRACE:
            if cur + 16 + 2 > stop:
                raise _bad(f"{where} frame {i} is shorter than its trace id")
            trace = uuid.UUID(bytes=raw[cur:cur + 16])
            cur += 16
        txn_end = cur + 2 + _U16.unpack_from(raw, cur)[0]
        if txn_end > stop:
            raise _bad(f"{where} frame {i}: the transaction id runs past the frame")
        try:
            txn = raw[cur + 2:txn_end].decode("utf-8")
        except UnicodeDecodeError:
            raise _bad(f"{where} frame {i}: the transaction id is not UTF-8") from None
        data = _payload(raw[txn_end:stop], f"{where} frame {i}.payload", max_payload)
        out.append(PushItem(queue, partition, data, parse.txn_id(txn, f"{where} frame {i}.transactionId"), trace,
                            None, mid))
        at = stop
    if at != end:
        raise _bad(f"{end - at} bytes after {where}'s {n} frames")
    return out


def _groups(r: _Reader, flags: int, budget: _Budget, max_payload: int) -> list[PushItem]:
    """``u32 groups | per group: u16 queue | u16 partition | u32 n | items``; items are
    ``n x ([u16 txn, flag 4] | u32 len, payload)``, or with flag 8 ``u32 z_len | z``."""
    groups = r.num(_U32, "the group count")
    if groups * 8 > r.left():
        raise _bad(f"{groups} groups declared, more than the body can hold")
    seen: set[str] = set()
    items: list[PushItem] = []
    for g in range(groups):
        where = f"group {g}"
        queue = _name(r.text(f"{where} queue"), f"{where}.queue", seen)
        partition = _name(r.text(f"{where} partition"), f"{where}.partition", seen)
        n = r.num(_U32, f"{where} count")
        if flags & F_FRAMES:
            budget.count(n, 0, r, where)
            z = r.take(r.num(_U32, f"{where} z_len"), f"{where} frames")
            items.extend(_frames(budget.inflate(z, None, f"{where} frames"), n, queue, partition, where, max_payload))
            continue
        budget.count(n, 6 if flags & F_TXN else 4, r, where)
        for i in range(n):
            at = f"{where} item {i}"
            txn = r.text(f"{at} transactionId") if flags & F_TXN else ""
            data = _payload(r.take(r.num(_U32, f"{at} length"), f"{at} payload"), f"{at}.payload", max_payload)
            items.append(PushItem(queue, partition, data, parse.txn_id(txn, f"{at}.transactionId") if txn else None,
                                  None, None))
    return items


def _name(value: str, what: str, seen: set[str]) -> str:
    if value not in seen:
        parse.name(value, what)
        seen.add(value)
    return value


def _header(raw: bytes, magic: bytes, allowed: int) -> tuple[_Reader, int]:
    r = _Reader(raw)
    if r.take(4, "the magic") != magic:
        raise _bad(f"does not start with {magic.decode()}")
    flags = r.take(1, "the flags")[0]
    if flags & ~allowed:
        raise _bad(f"unknown flags {flags & ~allowed}")
    return r, flags


@dataclass(frozen=True)
class PushBody:
    items: list[PushItem]
    counts: bool


def decode_push(raw: bytes, *, max_payload: int) -> PushBody:
    """A ``QPB1`` body: ``"QPB1" | u8 flags | [u32 raw_len, flag 1] | groups``."""
    r, flags = _header(raw, PUSH_MAGIC, PUSH_FLAGS)
    budget = _Budget()
    if flags & F_ZSTD:
        declared = r.num(_U32, "raw_len")
        r = _Reader(budget.inflate(r.data[r.at:], declared, "the body"))
    items = _groups(r, flags, budget, max_payload)
    r.end("last group")
    return PushBody(items, bool(flags & F_COUNTS))


@dataclass(frozen=True)
class TransactionBody:
    head: dict[str, Any]
    items: list[PushItem]
    counts: bool


def decode_transaction(raw: bytes, *, max_payload: int) -> TransactionBody:
    """A ``QTB1`` body: ``"QTB1" | u8 flags | u32 len, head JSON | groups as flag 8``."""
    r, flags = _header(raw, TX_MAGIC, TX_FLAGS)
    head_raw = r.take(r.num(_U32, "the head length"), "the head")
    head = parse_json(head_raw) if head_raw else {}
    if not isinstance(head, dict):
        raise BadRequest("bad_body", "the head of a binary transaction must be a JSON object")
    items = _groups(r, F_FRAMES, _Budget(), max_payload)
    r.end("last group")
    return TransactionBody(head, items, bool(flags & F_COUNTS))


def push_counts(results: list[dict[str, Any]]) -> dict[str, Any]:
    """The counts-only push answer (flag 2). ``error`` is null, or the error of the first item that
    failed (a full queue: its items answer ``failed``), with ``failed`` counting them."""
    statuses = [x["status"] for x in results]
    failed = [x for x in results if x["status"] == "failed"]
    return {"count": len(results), "queued": statuses.count("queued"), "duplicate": statuses.count("duplicate"),
            "failed": len(failed), "error": failed[0].get("error") if failed else None}


def transaction_counts(answer: dict[str, Any]) -> dict[str, Any]:
    """The counts-only transaction answer (flag 2): the pushes' and acks' results become
    ``pushed``/``duplicate``/``acked``; the riders' results stay."""
    results = answer.get("results")
    if not answer.get("success") or not isinstance(results, list):
        return answer
    kinds = [x.get("type") for x in results]
    pushed = sum(1 for x in results if x.get("type") == "push" and x.get("status") == "queued")
    return {**answer, "results": [x for x, k in zip(results, kinds, strict=True) if k not in ("push", "ack")],
            "pushed": pushed, "duplicate": kinds.count("push") - pushed, "acked": kinds.count("ack")}


# ---------------------------------------------------------------------------------------- framed pop

# The keys of a message the framed answer rebuilds (the client's decoder): every other key with a
# value makes the answer stay JSON, so a framed answer never drops a field the JSON one carries.
_FRAMED_KEYS = frozenset({"id", "transactionId", "traceId", "data", "producerSub", "createdAt", "partitionId",
                          "partition", "leaseId", "consumerGroup", "deliveryAttempt", "offset", "queue"})
# Top-level keys the decoder rebuilds itself; the others travel in the own-keys JSON.
_REBUILT = frozenset({"success", "queue", "leaseId", "consumerGroup", "partition", "partitionId", "messages"})


def wants_frames(request: web.Request) -> bool:
    """``frames=true`` on the pop, and an Accept that allows the framed type (the client sends */*)."""
    if request.query.get("frames", "").lower() not in ("true", "1", "yes"):
        return False
    accept = request.headers.get("Accept", "*/*")
    return any(t.split(";")[0].strip() in (POP_TYPE, "*/*", "application/*") for t in accept.split(","))


def _micros(text: str) -> int:
    """``YYYY-MM-DDTHH:MM:SS.mmmZ`` (render.ts) as microseconds since the epoch."""
    t = datetime.fromisoformat(text[:-1])
    return ((t.toordinal() - _EPOCH) * 86_400 + t.hour * 3600 + t.minute * 60 + t.second) * 1_000_000 + t.microsecond


def _text16(out: bytearray, value: str) -> bool:
    raw = value.encode("utf-8")
    if len(raw) > 0xFFFF:
        return False
    out += _U16.pack(len(raw))
    out += raw
    return True


def encode_pop(answer: dict[str, Any]) -> bytes | None:
    """The framed (``QPF1``) form of a JSON pop answer with messages, or None when it cannot carry
    it whole: a partition without a number (made before numbering), a message field the frame has no
    place for (an undecryptable message, a deadline), a value over a 16-bit length."""
    msgs = answer.get("messages") or []
    if not msgs:
        return None
    queue, lease, group = answer.get("queue", ""), answer.get("leaseId", ""), answer.get("consumerGroup", "")
    claims: list[tuple[int, str, int, list[dict[str, Any]]]] = []  # (number, partition, attempt, messages)
    numbers: dict[str, int | None] = {}
    extras: dict[tuple[str, ...], tuple[str, ...]] = {}  # a message's keys -> those frames have no place for
    for m in msgs:
        keys = tuple(m)
        extra = extras.get(keys)
        if extra is None:
            extra = extras[keys] = tuple(k for k in keys if k not in _FRAMED_KEYS)
        if extra and any(m[k] is not None for k in extra):
            return None
        if m.get("queue", queue) != queue or m.get("leaseId") != lease or m.get("consumerGroup") != group:
            return None
        pid = m["partitionId"]
        if pid not in numbers:
            numbers[pid] = partition_number(uuid.UUID(pid))
        number = numbers[pid]
        if number is None:
            return None
        last = claims[-1] if claims else None
        if (last is None or last[0] != number or last[2] != m["deliveryAttempt"]
                or last[3][-1]["offset"] >= m["offset"]):
            claims.append((number, m["partition"], m["deliveryAttempt"], [m]))
        else:
            last[3].append(m)
    own = {k: v for k, v in answer.items() if k not in _REBUILT}
    out = bytearray(POP_MAGIC)
    out.append(1)
    own_raw = orjson.dumps(own)
    out += _U32.pack(len(own_raw))
    out += own_raw
    if not (_text16(out, queue) and _text16(out, lease) and _text16(out, group)):
        return None
    out += _U32.pack(len(claims))
    for number, partition, attempt, claimed in claims:
        out += _U64.pack(number)
        if not _text16(out, partition):
            return None
        out += _U64.pack(claimed[0]["offset"])
        out += _U64.pack(claimed[-1]["offset"])
        out += _U32.pack(attempt)
        records = _records(claimed)
        out += _U32.pack(len(records))
        for record in records:
            pieces: list[bytes] = []
            for m in record:
                if not _frame(pieces, m):
                    return None
            body = b"".join(pieces)
            out += _U64.pack(record[0]["offset"])
            out += _I64.pack(_micros(record[0]["createdAt"]))
            out += _U32.pack(len(record))
            out.append(0)  # raw frames
            out += _U32.pack(len(body))
            out += body
    return bytes(out)


def _records(msgs: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Runs of consecutive offsets with one createdAt (a record has one base offset and one stamp)."""
    records: list[list[dict[str, Any]]] = []
    for m in msgs:
        last = records[-1] if records else None
        if last and last[-1]["offset"] + 1 == m["offset"] and last[0]["createdAt"] == m["createdAt"]:
            last.append(m)
        else:
            records.append([m])
    return records


_FRAME_HEAD = struct.Struct("<IB16s")


def _frame(out: list[bytes], m: dict[str, Any]) -> bool:
    """``u32 len | u8 flags | u8[16] id | [u8[16] trace] | u16 txn | [u16 producer] | payload``."""
    trace, producer = m.get("traceId"), m.get("producerSub")
    txn = m["transactionId"].encode()
    sub = producer.encode() if producer is not None else b""
    if len(txn) > 0xFFFF or len(sub) > 0xFFFF:
        return False
    data = orjson.dumps(m["data"])
    flags = (FRAME_TRACE if trace else 0) | (FRAME_PRODUCER if producer is not None else 0)
    size = 19 + len(txn) + len(data) + (16 if trace else 0) + (2 + len(sub) if producer is not None else 0)
    out.append(_FRAME_HEAD.pack(size, flags, bytes.fromhex(m["id"].replace("-", ""))))
    if trace:
        out.append(bytes.fromhex(trace.replace("-", "")))
    out += (_U16.pack(len(txn)), txn)
    if producer is not None:
        out += (_U16.pack(len(sub)), sub)
    out.append(data)
    return True
