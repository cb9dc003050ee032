"""The operator console: ``GET /console`` serves a static single-page app shipped in the package
(``broker/console/``: one HTML page, one script, one style sheet, and uPlot for the live charts vendored
under ``vendor/uplot/`` with its licence; no CDN, no build step).

The page holds no server-side state and reads nothing by itself: its script calls the public HTTP API
(``/api/v1/...``) with the bearer token the operator types into it (kept in the tab's sessionStorage),
and ``/api/v1/status/live`` for the live charts. So the console can show exactly what the
token may see, and every refusal it meets is the API's own envelope.

- ``GET /console`` and ``GET /console/``: the page.
- ``GET /console/{asset}`` and ``GET /console/vendor/uplot/{file}``: one of the files listed in ``ASSETS``
  (anything else: 404 ``no_such_asset``).
- ``QUEEN_CONSOLE=0``: every console path answers 404 ``console_disabled``.

The files are read once, when the routes are set up; responses carry a strict Content-Security-Policy
(scripts and styles only from this origin, no inline code).
"""

from __future__ import annotations

from importlib import resources

from aiohttp import web

from broker.context import BROKER, broker
from broker.errors import NotFound

ASSET_DIR = resources.files("broker") / "console"  # package data: found the same in a wheel as in a checkout
ASSETS = {
    "index.html": "text/html; charset=utf-8",
    "console.js": "text/javascript; charset=utf-8",
    "console.css": "text/css; charset=utf-8",
    # uPlot, the live charts' library, vendored unchanged from npm (vendor/uplot/SOURCE, MIT LICENSE)
    "vendor/uplot/uPlot.iife.min.js": "text/javascript; charset=utf-8",
    "vendor/uplot/uPlot.min.css": "text/css; charset=utf-8",
    "vendor/uplot/LICENSE": "text/plain; charset=utf-8",
}
HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; "
    "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}
FILES = web.AppKey("console_files", dict)


def _load() -> dict[str, bytes]:
    return {name: (ASSET_DIR / name).read_bytes() for name in ASSETS}


def _serve(request: web.Request, name: str) -> web.Response:
    if not broker(request).settings.console:
        raise NotFound("console_disabled", "the console is switched off on this broker (QUEEN_CONSOLE=0)",
                       code="console_disabled")
    files = request.app[FILES]
    if name not in files:
        raise NotFound("no_such_asset", f"the console has no file {name!r}", code="no_such_route")
    return web.Response(body=files[name], headers={**HEADERS, "Content-Type": ASSETS[name]})


async def page(request: web.Request) -> web.Response:
    return _serve(request, "index.html")


async def asset(request: web.Request) -> web.Response:
    return _serve(request, request.match_info["asset"])


async def uplot(request: web.Request) -> web.Response:
    return _serve(request, "vendor/uplot/" + request.match_info["file"])


def setup(app: web.Application) -> None:
    app[FILES] = _load() if app[BROKER].settings.console else {}
    app.router.add_get("/console", page)
    app.router.add_get("/console/", page)
    app.router.add_get("/console/{asset}", asset)
    app.router.add_get("/console/vendor/uplot/{file}", uplot)
