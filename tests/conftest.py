"""Shared test infrastructure.

- ``pg``: one PostgreSQL for the whole session: ``QUEEN_TEST_DATABASE_URL`` if set, else a
  testcontainers PostgreSQL where a Docker engine answers and ``QUEEN_TEST_DOCKER=1``, else an
  embedded one (pgserver) in a temporary directory.
- ``pg.new_db()``: a fresh database cloned from a migrated template (``CREATE DATABASE ... TEMPLATE``),
  so a test that needs a clean schema pays milliseconds, not a migration run.
- ``broker``: one real ``queen serve`` (2 workers, test hooks on) for the session, on its own database.
  Tests that share it use their own queue names (``uniq()``).
- ``start_broker(env=..., workers=...)``: a dedicated broker with its own settings and database,
  stopped at the end of the test.
- ``http`` / ``ahttp``: an httpx client on the shared broker; ``api``: ``helpers.Api`` over ``http``;
  ``queen_client``: the official ``queen-mq`` client on it
  (tests/helpers.py holds every request helper the tests share).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import uuid
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest

from broker.localserver import LocalBroker
from broker.store import migrate

TEMPLATE = "queen_template"


def pytest_collection_finish(session: pytest.Session) -> None:
    """Tests marked ``browser`` need a headless Chromium: find it, or install it (tests/browser.py), now,
    before any test's timeout starts."""
    if any(item.get_closest_marker("browser") for item in session.items):
        import browser

        browser.prepare()


def run_sync(coro: Coroutine[Any, Any, Any]) -> Any:
    """Run a coroutine to completion from sync code, even when an event loop runs in this thread."""
    with concurrent.futures.ThreadPoolExecutor(1) as ex:
        return ex.submit(asyncio.run, coro).result()


def uniq(prefix: str = "t") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


class PgServer:
    def __init__(self, admin_dsn: str, dsn_for: Callable[[str], str], controller: Any = None) -> None:
        self.admin_dsn = admin_dsn
        self.dsn_for = dsn_for
        self.controller = controller  # the EmbeddedPostgres, when we own the server

    async def _admin(self, sql: str) -> None:
        conn = await asyncpg.connect(self.admin_dsn)
        try:
            await conn.execute(sql)
        finally:
            await conn.close()

    def create_template(self) -> None:
        async def go() -> None:
            await self._admin(f'DROP DATABASE IF EXISTS "{TEMPLATE}" WITH (FORCE)')
            await self._admin(f'CREATE DATABASE "{TEMPLATE}"')
            await migrate.apply_url(self.dsn_for(TEMPLATE))

        run_sync(go())

    def new_db(self, name: str | None = None, *, template: bool = True) -> str:
        name = name or f"t_{uuid.uuid4().hex[:12]}"
        src = f' TEMPLATE "{TEMPLATE}"' if template else ""
        run_sync(self._admin(f'CREATE DATABASE "{name}"{src}'))
        return self.dsn_for(name)


def _dsn_with_db(dsn: str, db: str) -> str:
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(dsn)
    return urlunsplit((parts.scheme, parts.netloc, "/" + db, parts.query, parts.fragment))


def new_pg_dir(prefix: str = "queen-test-pg-") -> Path:
    """A directory for an embedded PostgreSQL data dir, OUTSIDE pytest's basetemp.

    pytest chmods its per-user temp root to 0700 at every session start and prunes old session dirs;
    PostgreSQL runs as the unprivileged ``pgserver`` user (we are root) and must keep access to its
    data dir, even when another pytest session starts on the same machine meanwhile.
    """
    import tempfile

    path = Path(tempfile.mkdtemp(prefix=prefix))
    path.chmod(0o755)
    return path


@pytest.fixture
def pg_dir() -> Iterator[Path]:
    """A fresh directory for a test's own embedded PostgreSQL (removed afterwards)."""
    import shutil

    path = new_pg_dir()
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def pg() -> Iterator[PgServer]:
    url = os.environ.get("QUEEN_TEST_DATABASE_URL")
    if url:
        server = PgServer(url, lambda db: _dsn_with_db(url, db))
        server.create_template()
        yield server
        return
    if os.environ.get("QUEEN_TEST_DOCKER") == "1":
        from testcontainers.postgres import PostgresContainer  # optional extra: queen-broker[docker]

        with PostgresContainer("postgres:16", driver=None) as c:
            base = c.get_connection_url()
            server = PgServer(base, lambda db: _dsn_with_db(base, db))
            server.create_template()
            yield server
        return
    import shutil

    from broker.store import embedded

    data_dir = new_pg_dir()
    emb = embedded.start(data_dir)
    server = PgServer(emb.dsn(), emb.dsn, controller=emb)
    server.create_template()
    yield server
    emb.stop()
    shutil.rmtree(data_dir, ignore_errors=True)


@pytest.fixture(scope="session")
def broker(pg: PgServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalBroker]:
    b = LocalBroker(
        dsn=pg.new_db("queen_shared"),
        workers=2,
        env={"QUEEN_TEST_HOOKS": "1", "QUEEN_SWEEPER_MAX_SLEEP_MS": "500"},
        log_path=tmp_path_factory.mktemp("logs") / "shared-broker.log",
    )
    b.start()
    yield b
    b.stop()


@pytest.fixture
def start_broker(pg: PgServer, tmp_path: Path) -> Iterator[Callable[..., LocalBroker]]:
    started: list[LocalBroker] = []

    def start(*, env: dict[str, str] | None = None, workers: int = 2, dsn: str | None = None, wait: bool = True) -> LocalBroker:
        b = LocalBroker(
            dsn=dsn or pg.new_db(), workers=workers, env=env, log_path=tmp_path / f"broker-{len(started)}.log"
        )
        started.append(b)
        b.start(wait=wait)
        return b

    yield start
    for b in started:
        b.stop()


@pytest.fixture
def http(broker: LocalBroker) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=broker.url, timeout=30) as client:
        yield client


@pytest.fixture
def api(http: httpx.Client) -> Any:
    """``helpers.Api`` over ``http``: the shared broker's routes."""
    from helpers import Api

    return Api(http)


@pytest.fixture
async def queen_client(broker: LocalBroker):  # type: ignore[no-untyped-def]
    """The official ``queen-mq`` client connected to the shared broker."""
    from queen import Queen

    async with Queen(broker.url) as q:
        yield q


@pytest.fixture
async def ahttp(broker: LocalBroker):  # type: ignore[no-untyped-def]
    async with httpx.AsyncClient(base_url=broker.url, timeout=30) as client:
        yield client


@pytest.fixture(scope="session")
def controlled_pg(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PgServer]:
    """An embedded PostgreSQL of its own (own data dir) that a test may stop and start:
    ``controlled_pg.controller.pg_ctl("stop")`` / ``pg_ctl("start")`` then ``refresh()``. It has no
    template: ``new_db(template=False)`` gives an empty database a broker migrates at boot. Tests must
    leave it running."""
    from broker.store import embedded

    emb = embedded.start(Path(tmp_path_factory.mktemp("controlled-pg")))
    yield PgServer(emb.dsn(), emb.dsn, controller=emb)
    emb.stop()
