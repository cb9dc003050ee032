"""UUIDv7 message ids: 48-bit Unix milliseconds, then random bits, so ids sort by mint time."""

from __future__ import annotations

import os
import time
import uuid


def uuid7() -> uuid.UUID:
    ms = time.time_ns() // 1_000_000
    rand = int.from_bytes(os.urandom(10), "big")
    value = (ms & ((1 << 48) - 1)) << 80
    value |= 0x7 << 76  # version 7
    value |= ((rand >> 62) & 0xFFF) << 64  # rand_a, 12 bits
    value |= 0b10 << 62  # RFC 4122 variant
    value |= rand & ((1 << 62) - 1)  # rand_b, 62 bits
    return uuid.UUID(int=value)


# Partition ids (queen_partition_id in sql/functions/log.sql): a partition number n in a version-8
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
