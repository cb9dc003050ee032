"""broker.timers.service on its own: which schedules the broker stores as ready for the log."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import zstandard

from broker.codec import Codec
from broker.timers.ops import TimerOp
from broker.timers.service import log_ready


def _op(payload: bytes | None, zstd: bool = False, op: str = "schedule") -> TimerOp:
    return TimerOp(op=op, queue="q", key="k", txn="t", payload=payload, payload_zstd=zstd, delay_ms=0)


@pytest.mark.parametrize(("payload", "zstd", "threshold", "ready"), [
    (b'{"n": 1}', False, 1024, True),
    (b'"just a string"', False, 1024, True),
    (b"42", False, 0, True),  # no compression threshold at all
    (b"\xff not json", False, 1024, False),  # judged at the fire: a permanent failure, then the DLQ
    (b'{"n": 1', False, 1024, False),
    (zstandard.ZstdCompressor().compress(b'{"n": 1}'), True, 1024, False),  # the fire decompresses it
    (b'{"s": "' + b"x" * 2000 + b'"}', False, 1024, False),  # at or above the threshold: the fire may compress
    (None, False, 1024, False),
])
def test_only_what_the_fire_would_store_unchanged_is_ready(payload, zstd, threshold, ready):
    broker: Any = SimpleNamespace(codec=Codec(threshold))
    assert log_ready(broker, _op(payload, zstd)) is ready
