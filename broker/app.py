"""The aiohttp application factory.

One ``Broker`` context per worker process (``app[BROKER]``, ``broker.context``) holds the settings, the
pool, the LISTEN notifier, the key ring, the codec, the token verifier, the supervised loops and the
services (built and started by ``broker.services``). Boot runs in the
background: until migrations are applied and the pool answers, every ``/api`` route answers 503
``booting`` and ``/health`` says why; a DSN that reaches only a standby waits there for a writable
primary (migrations are never attempted on a standby). A database that goes away later turns ``/health`` 503 and API
calls into 503 ``database_unavailable``; when it returns, the same pool reconnects.

One middleware (``edge_middleware``): boot flag and authentication, one envelope for everything (never a
traceback), metrics per route and rendered status.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import asyncpg
from aiohttp import web
from aiohttp.web_urldispatcher import UrlDispatcher, UrlMappingMatchInfo

from broker import errors, limits, metrics, services
from broker.config import Settings
from broker.context import BROKER, PRINCIPAL_KEY, Broker
from broker.http import ROUTE_MODULES
from broker.http.health import WAITING_FOR_PRIMARY
from broker.http.wire import refuse_repeated_query
from broker.log.parse import ACK_STATUSES
from broker.metrics import HTTP_LATENCY, HTTP_REQUESTS
from broker.store import migrate
from broker.store.failures import api_error, is_standby_answer
from broker.store.listen import Notifier
from broker.store.pool import create_pool, dsn_hosts

log = logging.getLogger("queen.app")

# Paths behind the boot flag and authentication: the client's routes (/api/, the streams SDK's
# /streams/) and the operator's (/admin/).
AUTHENTICATED_PREFIXES = ("/api/", "/streams/", "/admin/")


class Router(UrlDispatcher):
    """Collapses repeated slashes before routing: the official client joins ``base_url + path``
    without normalising, so ``http://h:6632/`` produces ``//api/v1/push``."""

    _slashes = re.compile(r"/{2,}")

    @classmethod
    def collapse(cls, path: str) -> str:
        return cls._slashes.sub("/", path) if "//" in path else path

    async def resolve(self, request: web.Request) -> UrlMappingMatchInfo:
        path = request.rel_url.raw_path
        if "//" in path:
            request = request.clone(rel_url=request.rel_url.with_path(self.collapse(path), encoded=True))
        return await super().resolve(request)


def _http_exception_to_api(exc: web.HTTPException) -> errors.ApiError:
    if exc.status == 404:
        return errors.NotFound("no_such_route", "no route matches this path", code="no_such_route")
    if exc.status == 405:
        allow = {"Allow": exc.headers["Allow"]} if "Allow" in exc.headers else None
        return errors.MethodNotAllowed("method_not_allowed", "this route does not accept this method", headers=allow)
    if exc.status == 413:
        return errors.PayloadTooLarge("body_too_large", f"the request body exceeds the limit: {exc.text}")
    if 400 <= exc.status < 500:
        return errors.ApiError("http_error", exc.text or exc.reason, code="bad_request", status=exc.status)
    return errors.Unavailable("http_error", exc.text or exc.reason, code="unavailable")


def _error_answer(request: web.Request, exc: Exception) -> web.Response:
    """The envelope for what a handler (or the checks before it) raised: a refusal, aiohttp's own
    HTTP errors, a database failure's 503; anything else is logged and answers 500 without a traceback."""
    if isinstance(exc, web.HTTPException):
        err = _http_exception_to_api(exc)
    else:
        answer = api_error(exc)
        if answer is None:
            log.exception("unhandled error on %s %s", request.method, request.path, exc_info=exc)
            return web.Response(body=errors.internal_envelope(), status=500, content_type="application/json")
        err = answer
    return web.Response(body=err.body(), status=err.status, headers=err.headers, content_type="application/json")


@web.middleware
async def edge_middleware(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
    """Every request, in one layer (each middleware layer is a coroutine frame that every resumption of
    the request's task passes through again): the boot flag and authentication for the authenticated
    prefixes, with the request's admissions in flight until it ends; one envelope for everything raised;
    the per-route metrics of the rendered status."""
    resource = request.match_info.route.resource
    route = resource.canonical if resource else "unmatched"
    start = time.perf_counter()
    status = 500  # what the metrics say of a request that ends by cancellation (its client went away)
    try:
        try:
            # The path as routed (repeated slashes collapsed, as Router does): "//api/v1/..." reaches an
            # /api handler, so it must not skip the boot flag and authentication.
            if Router.collapse(request.path).startswith(AUTHENTICATED_PREFIXES):
                b = request.app[BROKER]
                if not b.ready:
                    raise errors.booting(f"the broker is starting: {b.boot_reason}")
                if b.draining:
                    raise errors.Unavailable("draining", "this worker is shutting down; retry", code="unavailable")
                request[PRINCIPAL_KEY] = b.verifier.principal(request.headers.get("Authorization"))
                refuse_repeated_query(request)
                scope = limits.open_admissions()  # the request's admissions are in flight until it ends
                try:
                    resp = await handler(request)
                finally:
                    limits.close_admissions(scope)
            else:
                resp = await handler(request)
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            resp = _error_answer(request, exc)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            resp = _error_answer(request, exc)
        status = resp.status
        return resp
    finally:
        metrics.observe_http(route, request.method, status, time.perf_counter() - start)


async def _boot(b: Broker) -> None:
    """Connect, migrate, open the pool, start the notifier and the ready hooks. Retries for ever."""
    attempt = 0
    while True:
        attempt += 1
        try:
            applied = (await migrate.run(b.dsn)).applied
            if applied:
                log.info("worker %d applied migrations %s", b.worker_index, applied)
            b.pool = await create_pool(b.settings, b.dsn)
            break
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if isinstance(exc, asyncpg.TargetServerAttributeNotMatched) or is_standby_answer(exc):
                # A standby (or a demoted primary) answered: wait for a writable one, never migrate there.
                reason = f"{WAITING_FOR_PRIMARY}: no server among {dsn_hosts(b.dsn)} accepts writes"
            else:
                reason = f"database not ready ({type(exc).__name__}: {exc})"
            if reason.split(" (")[0] != b.boot_reason.split(" (")[0] or attempt % 50 == 0:
                log.warning("boot attempt %d: %s; retrying", attempt, reason)
            b.boot_reason = reason
            await asyncio.sleep(min(2.0, 0.2 * attempt))
    b.notifier = Notifier(b.dsn)
    await services.start(b)
    settle_heap()
    b.ready = True
    b.boot_reason = "ready"
    log.info("worker %d ready", b.worker_index)


# The collector's thresholds in a booted worker (CPython's default is 700, 10, 10). A worker's garbage is
# almost all freed by reference counting; what a collection finds is the live objects of the requests in
# flight, scanned again and again. Measured under the log bench's phases at the defaults: a full
# collection about once a second per worker, 2-9 ms of CPU each that found nothing (collected 0), and
# young collections (generation 1) over 2 ms more than once a second in pop phases; every request of the
# worker waits behind each one: the light phase's tail. At these thresholds the same phases ran no full
# collection and one young collection over 2 ms. A cycle still goes at the next young collection, i.e.
# within some 50,000 allocations.
GC_THRESHOLDS = (50_000, 20, 100)


def settle_heap() -> None:
    """At the end of a worker's boot: everything built so far (modules, routes, the pool) lives as long as
    the worker, so it is moved out of the collector's view (a full collection of a booted worker took
    36-42 ms), and the thresholds become GC_THRESHOLDS. The benches' load generators call it too, so
    their own collections are not counted as the broker's latency."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


async def _broker_ctx(app: web.Application) -> AsyncIterator[None]:
    b = app[BROKER]
    boot = asyncio.get_running_loop().create_task(_boot(b), name="boot")
    yield
    b.draining = True
    boot.cancel()
    try:
        await boot
    except (asyncio.CancelledError, Exception):
        pass
    await services.stop(b)
    await b.loops.stop()
    if b.pool is not None:
        try:
            await asyncio.wait_for(b.pool.close(), timeout=5)
        except Exception:
            b.pool.terminate()


async def _on_shutdown(app: web.Application) -> None:
    await services.shutdown(app[BROKER])


def create_app(settings: Settings, dsn: str, *, worker_index: int = 0, lanes_dir: str | None = None) -> web.Application:
    app = web.Application(
        router=Router(),
        middlewares=[edge_middleware],
        client_max_size=settings.max_body_bytes,
    )
    b = Broker(settings=settings, dsn=dsn, worker_index=worker_index, lanes_dir=lanes_dir)
    services.build(b)
    app[BROKER] = b
    app.cleanup_ctx.append(_broker_ctx)
    app.on_shutdown.append(_on_shutdown)
    for module in ROUTE_MODULES:
        module.setup(app)
    preset_metrics()
    return app


# The HTTP series created at 0: the two routes every deployment calls from boot on (probes, scrapes),
# at the statuses any route can answer whatever it does (an unexpected failure, the database
# unavailable). Per route for every route they would be ~2,000 series that made a fresh broker's scrape
# 209 kB and 185 ms instead of 10 kB and 25 ms; the other routes' series appear with their first call.
INFRA_ROUTES = (("/health", "GET"), ("/metrics", "GET"))
ANY_ROUTE_FAILURES = ("500", "503")


def preset_metrics() -> None:
    """Every labelled series the Grafana dashboard (ops/grafana/queen.json) reads, at 0 from boot, with
    the closed set of label values the code draws from (loop names are created as the loops start)."""
    metrics.preset(metrics.MESSAGES_PUSHED, metrics.PUSH_SOURCES)
    metrics.preset(metrics.MESSAGES_ACKED, ACK_STATUSES)
    metrics.preset(metrics.MESSAGES_DELETED, metrics.DELETE_RESULTS)
    metrics.preset(metrics.PUSH_LANE_JOBS, metrics.LANE_RESULTS)
    metrics.preset(metrics.TIMERS_FIRE_FAILED, metrics.FIRE_FAILURE_CLASSES)
    metrics.preset(metrics.LIMIT_REFUSALS, limits.REFUSAL_CODES)
    for route, method in INFRA_ROUTES:
        HTTP_LATENCY.labels(route, method)
        for status in ANY_ROUTE_FAILURES:
            HTTP_REQUESTS.labels(route, method, status)
