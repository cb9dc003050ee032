"""Timestamps on the wire (no Locust/gevent import here: the asyncio scenario and the runner use it)."""

from __future__ import annotations

from datetime import datetime


def parse_iso(text: str) -> float:
    """``2026-11-30T12:00:00.123456Z`` (or with an offset) as seconds since the epoch."""
    if text.endswith("Z"):
        text = text[:-1] + "+00:00"
    return datetime.fromisoformat(text).timestamp()
