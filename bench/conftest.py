"""Shared bench fixtures and the ratio report.

- Files named ``bench_*.py`` are collected (``pytest bench``), tests inside them as usual (``test_*``).
  The default test run never sees them: pyproject's testpaths is ``["tests"]``.
- ``bench_pg``: one PostgreSQL for the session (``QUEEN_BENCH_DATABASE_URL`` if set, else an embedded
  one in a temporary directory); ``bench_db``: a fresh, migrated database on it (DSN);
  ``bench_broker``: a real ``queen serve`` (2 workers) on its own database, for benches over HTTP;
  ``loop``: an event loop of the test's own.
- Every bench sets ``benchmark.group`` and ``benchmark.extra_info["role"]`` to ``"baseline"`` or
  ``"ours"``; at the end the median of "ours" is divided by the median of "baseline" of the same group and
  printed as ``ratio``: how many times the baseline's cost our code pays (1.00 = no overhead).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import uuid
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any

import pytest

from broker.process.localserver import LocalBroker


def run_sync(coro: Coroutine[Any, Any, Any]) -> Any:
    with concurrent.futures.ThreadPoolExecutor(1) as ex:
        return ex.submit(asyncio.run, coro).result()


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> pytest.Module | None:
    if file_path.suffix == ".py" and file_path.name.startswith("bench_"):
        return pytest.Module.from_parent(parent, path=file_path)
    return None


class BenchPg:
    def __init__(self, admin_dsn: str, controller: Any = None) -> None:
        self.admin_dsn = admin_dsn
        self.controller = controller

    def dsn_for(self, db: str) -> str:
        from urllib.parse import urlsplit, urlunsplit

        p = urlsplit(self.admin_dsn)
        return urlunsplit((p.scheme, p.netloc, "/" + db, p.query, p.fragment))

    def new_db(self) -> str:
        import asyncpg

        from broker.store import migrate

        name = f"bench_{uuid.uuid4().hex[:10]}"

        async def go() -> None:
            conn = await asyncpg.connect(self.admin_dsn)
            try:
                await conn.execute(f'CREATE DATABASE "{name}"')
            finally:
                await conn.close()
            await migrate.run(self.dsn_for(name))

        run_sync(go())
        return self.dsn_for(name)


@pytest.fixture(scope="session")
def bench_pg() -> Iterator[BenchPg]:
    url = os.environ.get("QUEEN_BENCH_DATABASE_URL")
    if url:
        yield BenchPg(url)
        return
    from broker.store import embedded

    # Not under pytest's basetemp: every pytest session that starts on this machine chmods
    # /tmp/pytest-of-<user> back to 0700, which locks out the unprivileged user embedded PostgreSQL runs
    # as (initdb then fails with "Permission denied").
    emb = embedded.start_scratch("queen-bench-pg-")
    try:
        yield BenchPg(emb.dsn(), emb)
    finally:
        emb.stop()


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    """An event loop of the test's own, for benches that time ``loop.run_until_complete(...)`` rounds."""
    lp = asyncio.new_event_loop()
    yield lp
    lp.close()


@pytest.fixture(scope="session")
def bench_db(bench_pg: BenchPg) -> str:
    return bench_pg.new_db()


@pytest.fixture(scope="session")
def bench_broker(bench_pg: BenchPg, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalBroker]:
    b = LocalBroker(dsn=bench_pg.new_db(), workers=2, log_path=tmp_path_factory.mktemp("benchlogs") / "broker.log")
    b.start(timeout=120)
    yield b
    b.stop()


def ratios(benchmarks: list[Any]) -> list[tuple[str, str, float, str, float, float]]:
    """(group, baseline name, baseline median, ours name, ours median, ratio) for every complete group."""
    by_group: dict[str, dict[str, Any]] = {}
    for b in benchmarks:
        role = (getattr(b, "extra_info", None) or {}).get("role")
        if role in ("baseline", "ours") and b.group:
            by_group.setdefault(b.group, {})[role] = b
    out = []
    for group, roles in sorted(by_group.items()):
        if "baseline" in roles and "ours" in roles:
            base, ours = roles["baseline"], roles["ours"]
            bm, om = base.stats.median, ours.stats.median
            out.append((group, base.name, bm, ours.name, om, om / bm if bm else float("nan")))
    return out


@pytest.hookimpl(trylast=True)
def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    bs = getattr(config, "_benchmarksession", None)
    if bs is None or not getattr(bs, "benchmarks", None):
        return
    rows = ratios(bs.benchmarks)
    if not rows:
        return
    tr = terminalreporter
    tr.write_sep("-", "ours vs baseline (same run): ratio = median(ours) / median(baseline)")
    for group, bname, bm, oname, om, r in rows:
        tr.write_line(f"{group:<28} baseline {bname} {bm * 1e6:10.2f} us   ours {oname} {om * 1e6:10.2f} us   ratio {r:6.2f}")
