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
    """The document as served: the YAML, with each JSON request body also listed under the media types
    of ``x-json-body-aliases`` (the broker reads them all as JSON; see ``broker.http.wire.read_json``)."""
    doc: dict[str, Any] = yaml.safe_load(resources.files("broker").joinpath("openapi.yaml").read_text(encoding="utf-8"))
    aliases = doc.get("x-json-body-aliases", [])
    for item in doc["paths"].values():
        for op in item.values():
            content = op.get("requestBody", {}).get("content", {}) if isinstance(op, dict) else {}
            if "application/json" in content and "*/*" not in content:
                for alias in aliases:
                    content.setdefault(alias, content["application/json"])
    return doc


@functools.cache
def _body() -> bytes:
    return orjson.dumps(document())


async def openapi_json(_request: web.Request) -> web.Response:
    return web.Response(body=_body(), content_type="application/json")


def setup(app: web.Application) -> None:
    app.router.add_get("/openapi.json", openapi_json)
