"""``GET /openapi.json``: the OpenAPI 3.1 document of every route (``broker/openapi.yaml``, package data).

Open like ``/health`` (no credential). The YAML is read and rendered to JSON once per worker, on the
first request. The test suite keeps the document true: tests/test_openapi.py compares it with the
router both ways, and tests/conftest.py validates every exchange the tests make with a broker.
"""

from __future__ import annotations

import functools
from importlib import resources
from typing import Any

import orjson
import yaml
from aiohttp import web


@functools.cache
def document() -> dict[str, Any]:
    return yaml.safe_load(resources.files("broker").joinpath("openapi.yaml").read_text(encoding="utf-8"))


@functools.cache
def _body() -> bytes:
    return orjson.dumps(document())


async def openapi_json(_request: web.Request) -> web.Response:
    return web.Response(body=_body(), content_type="application/json")


def setup(app: web.Application) -> None:
    app.router.add_get("/openapi.json", openapi_json)
