"""``GET /metrics/prometheus`` (alias ``/metrics``): Prometheus text aggregated over every worker."""

from __future__ import annotations

from aiohttp import web

from broker import metrics


async def prometheus(_request: web.Request) -> web.Response:
    body, ctype = metrics.render()
    return web.Response(body=body, headers={"Content-Type": ctype})


def setup(app: web.Application) -> None:
    app.router.add_get("/metrics/prometheus", prometheus)
    app.router.add_get("/metrics", prometheus)
