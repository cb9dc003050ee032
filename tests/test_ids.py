"""broker/ids.py: UUIDv7 ids sort in mint order, also within one millisecond."""

from __future__ import annotations

import uuid

from broker import ids


def test_ids_minted_in_one_burst_sort_in_mint_order_and_are_distinct_v7():
    minted = [ids.uuid7() for _ in range(10_000)]  # thousands per millisecond: the sequence counts, then borrows
    assert minted == sorted(minted, key=str) == sorted(minted, key=lambda u: u.int)
    assert len(set(minted)) == len(minted)
    assert {u.version for u in minted} == {7} and {u.variant for u in minted} == {uuid.RFC_4122}


def test_the_time_prefix_is_the_wall_clock_in_milliseconds(monkeypatch):
    monkeypatch.setattr(ids.time, "time_ns", lambda: 1_700_000_000_123_456_789)
    monkeypatch.setattr(ids, "_last_ms", 0)
    a, b = ids.uuid7(), ids.uuid7()
    assert a.int >> 80 == b.int >> 80 == 1_700_000_000_123
    assert (b.int >> 64) & 0xFFF == ((a.int >> 64) & 0xFFF) + 1


def test_a_batch_of_text_ids_is_what_one_by_one_minting_gives():
    """uuid7_text(n): canonical text ids in mint order, sharing the sequence with uuid7() (so ids minted
    after a batch still sort after it), distinct even past 4,096 in one millisecond."""
    before = ids.uuid7()
    batch = ids.uuid7_text(5_000)
    after = ids.uuid7()
    parsed = [uuid.UUID(t) for t in batch]
    assert [str(u) for u in parsed] == batch
    assert [before, *parsed, after] == sorted([before, *parsed, after], key=lambda u: u.int)
    assert len(set(batch)) == len(batch)
    assert {u.version for u in parsed} == {7} and {u.variant for u in parsed} == {uuid.RFC_4122}


def test_a_batch_past_the_sequence_limit_borrows_the_next_millisecond_and_keeps_mint_order(monkeypatch):
    """uuid7_many(n) mints what n calls of uuid7() would: across the end of one millisecond's sequence
    it borrows the next millisecond, and uuid7() after it continues from where the batch stopped."""
    monkeypatch.setattr(ids.time, "time_ns", lambda: 1_700_000_000_123_456_789)
    monkeypatch.setattr(ids, "_last_ms", 1_700_000_000_123)
    monkeypatch.setattr(ids, "_seq", ids._SEQ_MAX - 2)
    batch = ids.uuid7_many(5)
    after = ids.uuid7()
    assert [(u.int >> 80, (u.int >> 64) & 0xFFF) for u in [*batch, after]] == [
        (1_700_000_000_123, ids._SEQ_MAX - 1), (1_700_000_000_123, ids._SEQ_MAX),
        (1_700_000_000_124, 0), (1_700_000_000_124, 1), (1_700_000_000_124, 2), (1_700_000_000_124, 3),
    ]
    assert all(isinstance(u, uuid.UUID) and u.version == 7 and u.variant == uuid.RFC_4122 for u in batch)
    assert len({u.int & ((1 << 62) - 1) for u in batch}) == 5  # the random tails differ
    assert ids.uuid7_many(0) == []
