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
import re as _re
import uuid
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import unquote as _unquote

import asyncpg
import httpx
import pytest

from broker.process.localserver import LocalBroker
from broker.store import migrate

TEMPLATE = "queen_template"


def pytest_collection_finish(session: pytest.Session) -> None:
    """Tests marked ``browser`` need a headless Chromium: find it, or install it (tests/browser.py), now,
    before any test's timeout starts."""
    if any(item.get_closest_marker("browser") for item in session.items):
        import browser

        browser.prepare()
    if any(item.path.name == "test_cells.py" for item in session.items):
        # HAProxy likewise (broker/cells/haproxy.py installs Debian's when missing and root); a failure
        # here is reported again, with its reason, by each test that needs it
        from broker.cells import haproxy

        try:
            haproxy.ensure_installed()
        except haproxy.HaproxyError:
            pass


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
            await migrate.run(self.dsn_for(TEMPLATE))

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


# --- every exchange with a test broker is checked against the OpenAPI document ---------------------
#
# A session-wide autouse fixture wraps httpx's transports (sync and async: the tests' own clients, the
# official queen-mq client and the conformance client all sit on them). Any exchange with a broker
# started through LocalBroker is validated against broker/openapi.yaml with openapi-core once its body
# has been read to the end:
#
# - the RESPONSE always: its status must be documented for the operation, its body must match. A request
#   to a path or method the document does not have must be the router's 404 ``no_such_route`` / 405
#   (``x-unrouted-responses``).
# - the REQUEST too, but a request the document calls invalid is a deliberate negative (the fuzz and
#   refusal tests) as long as the broker refused it (4xx); only a 2xx/3xx answer to it is a mismatch
#   (the broker accepts what the document forbids).
#
# Mismatches fail the test during which they happened (at its teardown), naming method, path, status
# and the schema error; ``QUEEN_TEST_OPENAPI=0`` turns the check off.

class _OpenApiTraffic:
    def __init__(self) -> None:
        self.bases: set[tuple[str, str, int]] = set()
        self.failures: list[str] = []
        self.checked = 0
        self._openapi: Any = None
        self._routes: list[tuple[_re.Pattern[str], str, list[str]]] = []

    # the document and its path templates
    def load(self) -> None:
        from openapi_core import OpenAPI

        from broker.http.openapi import document

        doc = document()
        self._doc = doc
        from openapi_core import Config
        from openapi_core.deserializing.media_types.util import json_loads

        # The document's JSON-body aliases (x-json-body-aliases) are JSON to the broker: parse them so.
        aliases = {m: json_loads for m in doc.get("x-json-body-aliases", [])}
        self._openapi = OpenAPI.from_dict(doc, config=Config(extra_media_type_deserializers=aliases))
        for template, item in doc["paths"].items():
            catch_all = {self._param(p)["name"] for p in item.get("parameters", []) if self._param(p).get("x-catch-all")}
            for method in ("get", "put", "post", "delete"):
                for p in item.get(method, {}).get("parameters", []):
                    if self._param(p).get("x-catch-all"):
                        catch_all.add(self._param(p)["name"])
            names: list[str] = []

            def group(m: _re.Match[str], names: list[str] = names, catch_all: set[str] = catch_all) -> str:
                names.append(m.group(1))
                return f"(?P<{m.group(1)}>.+)" if m.group(1) in catch_all else f"(?P<{m.group(1)}>[^/]+)"

            rx = _re.compile("^" + _re.sub(r"\\\{(\w+)\\\}", group, _re.escape(template)) + "$")
            self._routes.append((rx, template, names))
        # literal paths before templates, fewer parameters first (as the router resolves them)
        self._routes.sort(key=lambda r: (len(r[2]), -len(r[1])))

    def _param(self, p: dict[str, Any]) -> dict[str, Any]:
        if "$ref" in p:
            return self._doc["components"]["parameters"][p["$ref"].rsplit("/", 1)[-1]]
        return p

    def match(self, path: str) -> tuple[str, dict[str, str]] | None:
        """``path`` as sent (percent-encoded): the router matches segments before decoding, so an
        encoded ``/`` (``%2F``) stays inside its segment."""
        path = _re.sub(r"/{2,}", "/", path)  # the broker's Router collapses repeated slashes
        for rx, template, _names in self._routes:
            m = rx.match(path)
            if m:
                return template, {k: _unquote(v) for k, v in m.groupdict().items()}
        return None

    def wants(self, url: Any) -> bool:
        return (url.scheme, url.host, url.port) in self.bases

    def check(self, request: Any, status: int, headers: Any, body: bytes | None) -> None:
        """Validate one exchange; a mismatch is recorded, never raised into the caller's HTTP call."""
        try:
            problem = self._check(request, status, headers, body)
        except Exception as exc:  # a bug in this hook must not pass silently either
            problem = f"the OpenAPI check itself failed: {type(exc).__name__}: {exc}"
        self.checked += 1
        if problem:
            self.failures.append(f"{request.method} {request.url.raw_path.decode(errors='replace')} -> {status}: {problem}")

    def _check(self, request: Any, status: int, headers: Any, body: bytes | None) -> str | None:
        from openapi_core.datatypes import RequestParameters
        from werkzeug.datastructures import Headers, ImmutableMultiDict

        if self._openapi is None:
            self.load()
        method = request.method.lower()
        if method in ("head", "options"):
            return None
        found = self.match(request.url.raw_path.decode("ascii").split("?", 1)[0])
        operation = self._doc["paths"][found[0]].get(method) if found else None
        if operation is None:
            if str(status) in self._doc.get("x-unrouted-responses", {}):
                return self._check_envelope(status, headers, body)
            return "the document has no operation for this method and path" if found else "the document has no such path"
        template, path_params = found
        query = ImmutableMultiDict(list(request.url.params.multi_items()))
        req_headers = Headers(list(request.headers.items()))

        class _Req:
            host_url = f"{request.url.scheme}://{request.url.netloc.decode()}"
            path = request.url.path
            path_pattern = template
            parameters = RequestParameters(query=query, header=req_headers, cookie=ImmutableMultiDict(), path=path_params)
            # RFC 9110 8.3: a body without Content-Type may be taken as application/octet-stream (aiohttp does)
            content_type = request.headers.get("content-type") or ("application/octet-stream" if request.content else "")
            body = request.content or None

        req = _Req()
        req.method = method  # type: ignore[attr-defined]
        problems: list[str] = []
        if status < 400:
            errors = list(self._openapi.iter_request_errors(req))
            if errors:
                problems.append("the broker accepted a request the document refuses: " + self._describe(errors[0]))
        if status == 204 or status == 304:
            body = None
        ctype = headers.get("content-type", "")

        class _Resp:
            status_code = status
            content_type = ctype
            data = body

        _Resp.headers = Headers(list(headers.items()))  # type: ignore[attr-defined]
        if body is not None or status in (204, 304):
            errors = list(self._openapi.iter_response_errors(req, _Resp()))
            if errors:
                problems.append("the response does not match the document: " + self._describe(errors[0]))
        return "; ".join(problems) or None

    def _check_envelope(self, status: int, headers: Any, body: bytes | None) -> str | None:
        import orjson

        if body is None:
            return None
        try:
            env = orjson.loads(body)
        except orjson.JSONDecodeError:
            return f"a {status} of the router must carry the error envelope; got {body[:200]!r}"
        if not (isinstance(env, dict) and all(isinstance(env.get(k), str) for k in ("error", "reason", "detail"))):
            return f"a {status} of the router must carry the error envelope; got {body[:200]!r}"
        return None

    @staticmethod
    def _describe(exc: BaseException) -> str:
        parts = [f"{type(exc).__name__}: {exc}"]
        cause = exc.__cause__
        while cause is not None:
            schema_errors = getattr(cause, "schema_errors", None)
            if schema_errors:
                for e in list(schema_errors)[:3]:
                    e = _deepest(e)
                    where = "/".join(map(str, e.absolute_path)) or "<body>"
                    parts.append(f"at {where}: {e.validator} {e.validator_value!r} fails on {repr(e.instance)[:150]}")
                break
            else:
                parts.append(f"{type(cause).__name__}: {cause}")
            cause = cause.__cause__
        return " | ".join(p[:300] for p in parts)


def _deepest(e: Any) -> Any:
    """The innermost error of a oneOf/anyOf/allOf failure: the field that is actually wrong."""
    while getattr(e, "context", None):
        e = max(e.context, key=lambda c: len(c.absolute_path))
    return e


OPENAPI_TRAFFIC = _OpenApiTraffic()


class _Tap:
    """Collects a response body as the test reads it and reports it once: whole, or ``None`` when the
    stream was closed before its end."""

    def __init__(self, inner: Any, done: Callable[[bytes | None], None]) -> None:
        self.inner, self.done, self.buf, self.fired = inner, done, bytearray(), False

    def _fire(self, body: bytes | None) -> None:
        if not self.fired:
            self.fired = True
            self.done(body)


class _TapSync(_Tap, httpx.SyncByteStream):
    def __iter__(self) -> Iterator[bytes]:
        for chunk in self.inner:
            self.buf += chunk
            yield chunk
        self._fire(bytes(self.buf))

    def close(self) -> None:
        self._fire(None)  # closed before the end (a test that read only the headers): status only
        self.inner.close()


class _TapAsync(_Tap, httpx.AsyncByteStream):
    async def __aiter__(self):  # type: ignore[no-untyped-def]
        async for chunk in self.inner:
            self.buf += chunk
            yield chunk
        self._fire(bytes(self.buf))

    async def aclose(self) -> None:
        self._fire(None)
        await self.inner.aclose()


def _done(request: httpx.Request, response: httpx.Response) -> Callable[[bytes | None], None]:
    def done(body: bytes | None) -> None:
        encoding = response.headers.get("content-encoding", "identity")
        if body is not None and encoding not in ("", "identity"):
            body = None  # compressed on the wire: validate the status and headers only
        if body is None and response.status_code not in (204, 304):
            # read partially: only whether the status is documented for the operation
            OPENAPI_TRAFFIC.check(request, response.status_code, response.headers, None)
            return
        OPENAPI_TRAFFIC.check(request, response.status_code, response.headers, body)

    return done


@pytest.fixture(scope="session", autouse=True)
def _openapi_traffic_hook() -> Iterator[_OpenApiTraffic]:
    if os.environ.get("QUEEN_TEST_OPENAPI", "1") == "0":
        yield OPENAPI_TRAFFIC
        return
    orig_start = LocalBroker.start
    orig_stop = LocalBroker.stop
    orig_sync = httpx.HTTPTransport.handle_request
    orig_async = httpx.AsyncHTTPTransport.handle_async_request

    def start(self: LocalBroker, *args: Any, **kwargs: Any) -> Any:
        url = httpx.URL(self.url)
        OPENAPI_TRAFFIC.bases.add((url.scheme, url.host, url.port))
        return orig_start(self, *args, **kwargs)

    def stop(self: LocalBroker, *args: Any, **kwargs: Any) -> Any:
        # The port is free again, and whatever binds it next (a Patroni or etcd node of a cluster test,
        # whose GET /health is not ours) is no broker: its traffic is not checked against our document.
        try:
            return orig_stop(self, *args, **kwargs)
        finally:
            url = httpx.URL(self.url)
            OPENAPI_TRAFFIC.bases.discard((url.scheme, url.host, url.port))

    def handle_request(self: httpx.HTTPTransport, request: httpx.Request) -> httpx.Response:
        if not OPENAPI_TRAFFIC.wants(request.url):
            return orig_sync(self, request)
        request.read()
        response = orig_sync(self, request)
        response.stream = _TapSync(response.stream, _done(request, response))
        return response

    async def handle_async_request(self: httpx.AsyncHTTPTransport, request: httpx.Request) -> httpx.Response:
        if not OPENAPI_TRAFFIC.wants(request.url):
            return await orig_async(self, request)
        await request.aread()
        response = await orig_async(self, request)
        response.stream = _TapAsync(response.stream, _done(request, response))
        return response

    LocalBroker.start = start  # type: ignore[method-assign]
    LocalBroker.stop = stop  # type: ignore[method-assign]
    httpx.HTTPTransport.handle_request = handle_request  # type: ignore[method-assign]
    httpx.AsyncHTTPTransport.handle_async_request = handle_async_request  # type: ignore[method-assign]
    try:
        yield OPENAPI_TRAFFIC
    finally:
        LocalBroker.start = orig_start  # type: ignore[method-assign]
        LocalBroker.stop = orig_stop  # type: ignore[method-assign]
        httpx.HTTPTransport.handle_request = orig_sync  # type: ignore[method-assign]
        httpx.AsyncHTTPTransport.handle_async_request = orig_async  # type: ignore[method-assign]
    left = OPENAPI_TRAFFIC.failures
    if left:  # answers that completed after their test ended
        pytest.fail("exchanges that do not match broker/openapi.yaml:\n" + "\n".join(left[:50]), pytrace=False)


@pytest.fixture(autouse=True)
def _openapi_traffic_per_test(_openapi_traffic_hook: _OpenApiTraffic) -> Iterator[None]:
    yield
    failures, _openapi_traffic_hook.failures[:] = list(_openapi_traffic_hook.failures), []
    if failures:
        pytest.fail(
            f"{len(failures)} exchange(s) with the broker do not match broker/openapi.yaml:\n" + "\n".join(failures[:20]),
            pytrace=False,
        )
