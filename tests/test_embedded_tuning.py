"""The embedded PostgreSQL is sized for the machine it starts on (broker/store/embedded.py): the sizing
follows memory and free disk within bounds, a started server runs with exactly those values, and a
scratch server (benches, load tests) deletes its directory when it stops."""

from __future__ import annotations

import pytest

from broker.store import embedded
from broker.store.embedded import GB, MB, tuning


def test_sizing_follows_memory_and_disk_within_bounds() -> None:
    small = tuning(1 * GB, 5 * GB)
    assert small["shared_buffers"] == "128MB" and small["max_wal_size"] == "1024MB"
    mid = tuning(24 * GB, 500 * GB)
    assert mid["shared_buffers"] == f"{3 * GB // MB}MB"
    assert mid["effective_cache_size"] == f"{12 * GB // MB}MB"
    assert mid["max_wal_size"] == "8192MB" and mid["min_wal_size"] == "1024MB"
    big = tuning(512 * GB, 10_000 * GB)
    assert big["shared_buffers"] == "4096MB" and big["maintenance_work_mem"] == "1024MB"
    for t in (small, mid, big):  # durability is never traded: nothing here touches fsync or commits
        assert not {"fsync", "synchronous_commit", "full_page_writes"} & set(t)


def test_machine_memory_is_positive() -> None:
    assert embedded.machine_memory() > 256 * MB


def test_the_embedded_server_runs_with_the_sizing(pg) -> None:  # type: ignore[no-untyped-def]
    if pg.controller is None:
        pytest.skip("the session PostgreSQL is not the embedded one")
    emb = pg.controller
    assert emb.untuned() == []
    got = emb.settings()
    assert got["max_connections"] == "400"
    want_kb = int(emb.tuning["shared_buffers"][:-2]) * 1024
    assert got["shared_buffers"] == f"{want_kb}kB"


def test_a_scratch_server_takes_its_directory_with_it() -> None:
    """The benches' and load tests' throwaway server: stop() deletes the data it wrote."""
    emb = embedded.start_scratch("queen-scratch-test-")
    d = emb.scratch
    assert d is not None and (d / "pg" / "PG_VERSION").exists()
    assert emb.dsn().startswith("postgresql://")
    emb.stop()
    assert not d.exists()
