"""UUIDv7 message ids: 48-bit Unix milliseconds, a 12-bit sequence, then random bits, so ids sort by mint
time, and ids minted by one process in the same millisecond sort in the order they were minted (the
12-bit field counts up within the millisecond, RFC 9562 §6.2 method 1). The official client orders a
popped batch by (createdAt, id): one push's items share createdAt, so their ids must keep item order
for the client's order to be the log's offset order (its streams runtime acks "the first N" of a batch)."""

from __future__ import annotations

import os
import struct
import time
import uuid

from asyncpg.pgproto.pgproto import UUID as _PgUUID

_SEQ_BITS = 12
_SEQ_MAX = (1 << _SEQ_BITS) - 1
_MS_MASK = (1 << 48) - 1
_RAND_B = (1 << 62) - 1
_VARIANT = 0b10 << 62  # RFC 4122 variant, the top two bits of the low half
_pack_u64x2 = struct.Struct(">QQ").pack
_last_ms = 0
_seq = 0


def _advance(ms: int, start: int) -> None:
    """Move the clock and sequence to the next id's, minted at Unix millisecond ``ms``; ``start`` (10
    random bits) is where a new millisecond's count begins."""
    global _last_ms, _seq
    if ms > _last_ms:
        _last_ms, _seq = ms, start  # a random start in the lower quarter leaves room to count
    elif _seq < _SEQ_MAX:
        _seq += 1  # same millisecond (or the clock stepped back): count up
    else:
        _last_ms, _seq = _last_ms + 1, 0  # 4,096 ids in one millisecond: borrow the next one


def _high() -> int:
    """The current id's upper 64 bits: the millisecond, version 7, the sequence (rand_a)."""
    return ((_last_ms & _MS_MASK) << 16) | (0x7 << 12) | _seq


def _next(rand: int, ms: int) -> int:
    """The next id as an integer, minted at Unix millisecond ``ms`` from 72 random bits (62 for rand_b,
    10 for a sequence start)."""
    _advance(ms, rand >> 62)
    return (_high() << 64) | _VARIANT | (rand & _RAND_B)


def uuid7() -> uuid.UUID:
    return uuid.UUID(int=_next(int.from_bytes(os.urandom(9), "big"), time.time_ns() // 1_000_000))


def uuid7_many(n: int) -> list[uuid.UUID]:
    """``n`` ids exactly as ``n`` calls of ``uuid7()`` would mint them now (one clock read: the same
    millisecond, the sequence counting up and borrowing the next millisecond past 4,096), with one read
    of the random source for all of them and the sequence advanced once per run of one millisecond, not
    once per id. They are asyncpg's own UUID objects (a ``uuid.UUID`` subclass, built from 16 bytes in C,
    which asyncpg writes to the wire as they are): a 100-item push spent 215 us minting its ids one by
    one, 40 this way (docs/performance.md, "Push")."""
    global _seq
    if n <= 0:
        return []
    ms = time.time_ns() // 1_000_000
    raw = os.urandom(8 * n + 2)
    lows = struct.unpack_from(f">{n}Q", raw)
    start = int.from_bytes(raw[-2:], "big") >> 6  # 10 random bits: where a new millisecond's count starts
    out: list[uuid.UUID] = []
    done = 0
    while done < n:
        _advance(ms, start)  # the run's first id, as _next mints it
        run = min(n - done, _SEQ_MAX - _seq + 1)  # ids left in this millisecond's sequence
        high = _high()
        out.extend(_PgUUID(_pack_u64x2(high + k, (lows[done + k] & _RAND_B) | _VARIANT)) for k in range(run))
        _seq += run - 1  # the rest of the run counted at once
        done += run
    return out


def uuid7_text(n: int) -> list[str]:
    """``uuid7_many(n)`` in canonical text form (timer ids travel as text)."""
    return [str(u) for u in uuid7_many(n)]


# Partition ids (queen_partition_id in broker/sql/functions/log.sql): a partition number n in a version-8
# UUID, 00000000-0000-8000 then n with its top two bits replaced by the variant (10). The framed pop
# answer carries a partition as that u64; a client sends it back as a decimal string.
_PARTITION_HEAD = bytes(6) + b"\x80\x00"
PARTITION_NUMBER_MAX = (1 << 62) - 1


def partition_uuid(number: int) -> uuid.UUID:
    """The id of partition ``number`` (1..PARTITION_NUMBER_MAX)."""
    return uuid.UUID(bytes=_PARTITION_HEAD + (number | (1 << 63)).to_bytes(8, "big"))


def partition_number(pid: uuid.UUID) -> int | None:
    """The number inside a partition id, or None for an id that carries none (made before numbering)."""
    raw = pid.bytes
    if raw[:8] != _PARTITION_HEAD or raw[8] & 0xC0 != 0x80:
        return None
    return int.from_bytes(raw[8:], "big") & PARTITION_NUMBER_MAX
