"""The HTTP connection layer under the aiohttp application: what happens before a request reaches a
handler, and to clients that never finish one.

aiohttp's own connection handler answers protocol errors (a bad chunk size, a negative Content-Length,
Content-Length with Transfer-Encoding, NUL or non-ASCII bytes in the path, an oversized header, a bad
HTTP version) itself, in plain text, and waits for ever on a client that trickles its headers. Here:

- every answer aiohttp makes on its own is the JSON envelope (``bad_http`` for the parser's 400s);
- ``QUEEN_HEADER_TIMEOUT_S``: a request whose line and headers are not complete this long after its
  first byte is answered 408 ``header_timeout`` and the connection closed;
- ``QUEEN_BODY_TIMEOUT_S``: a body not complete this long after its headers is answered 408
  ``body_timeout`` and the connection closed (the handler, still waiting to read it, is cancelled:
  nothing is applied from a body that never arrived);
- both clocks are read by one tick per worker every ``TICK_S`` (0.25 s), so either fires up to that
  much after it is due;
- ``QUEEN_KEEPALIVE_TIMEOUT_S``: an idle keep-alive connection (or one that never sends a byte) is
  closed after this long;
- ``QUEEN_MAX_CONNECTIONS``: a worker holding this many open connections answers each further one's
  first request 503 ``too_many_connections`` (with Retry-After) and closes it.

``QueenRunner`` is the ``web.AppRunner`` that builds connections with ``QueenRequestHandler``; the
worker (broker/process/supervisor.py) serves through it.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import orjson
from aiohttp import web
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_request import BaseRequest

from broker.config import Settings

log = logging.getLogger("queen.server")

_PHRASES = {400: "Bad Request", 408: "Request Timeout", 413: "Payload Too Large", 431: "Request Header Fields Too Large",
            500: "Internal Server Error", 503: "Service Unavailable", 504: "Gateway Timeout"}


def envelope_bytes(status: int, error: str, reason: str, detail: str, *, retry_after: int | None = None) -> bytes:
    """A complete HTTP/1.1 response carrying the envelope, closing the connection (written raw to the
    transport where no request object exists, e.g. a timed-out header)."""
    body = orjson.dumps({"error": error, "reason": reason, "detail": detail})
    head = [f"HTTP/1.1 {status} {_PHRASES.get(status, 'Error')}", "Content-Type: application/json",
            f"Content-Length: {len(body)}", "Connection: close"]
    if retry_after is not None:
        head.append(f"Retry-After: {retry_after}")
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


def _json(status: int, error: str, reason: str, detail: str, headers: dict[str, str] | None = None) -> web.Response:
    resp = web.Response(
        body=orjson.dumps({"error": error, "reason": reason, "detail": detail}),
        status=status, content_type="application/json", headers=headers,
    )
    resp.force_close()
    return resp


class QueenRequestHandler(RequestHandler):
    """One connection. Adds the envelope on aiohttp's own errors, the header and body timeouts and
    the per-worker connection cap (see the module docstring)."""

    def __init__(self, manager: Any, *, limits: Settings, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self._q_header_timeout = float(limits.header_timeout_s)
        self._q_body_timeout = float(limits.body_timeout_s)
        self._q_max_connections = limits.max_connections
        # The one clock a connection has running, read by its server's tick (QueenServer): when it runs
        # out (loop time; 0 = none running) and which it is, with the request a body clock is for.
        self._q_due = 0.0
        self._q_body: BaseRequest | None = None
        self._q_over_cap = False

    # ---- connection cap
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        if self._manager is not None and self._q_max_connections and len(self._manager.connections) > self._q_max_connections:
            self._q_over_cap = True
            self._request_handler = self._over_cap_handler

    async def _over_cap_handler(self, _request: BaseRequest) -> web.StreamResponse:
        return _json(
            503, "unavailable", "too_many_connections",
            f"this worker holds its maximum of {self._q_max_connections} open connections (QUEEN_MAX_CONNECTIONS); retry",
            headers={"Retry-After": "1"},
        )

    def connection_lost(self, exc: BaseException | None) -> None:
        self._q_cancel()
        super().connection_lost(exc)

    # ---- header and body timeouts
    def _q_cancel(self) -> None:
        self._q_due = 0.0
        self._q_body = None

    def _q_idle(self) -> bool:
        return not self._request_in_progress and not self._messages

    def data_received(self, data: bytes) -> None:
        if not self._q_due and self._q_header_timeout > 0 and self._q_idle() and not self._upgraded:
            # The first byte of a request: its line and headers must be complete in time.
            self._q_due = self._loop.time() + self._q_header_timeout
        super().data_received(data)
        if self._messages and self._q_due and not self._request_in_progress:
            self._q_cancel()  # headers complete: the body clock (if any) starts with the handler

    def _q_expired(self) -> None:
        """The tick found this connection's clock run out: the header clock if no request is being
        handled, else the body clock of the request it was started for."""
        body = self._q_body
        self._q_cancel()
        if body is None:
            if self._q_idle() and not self._force_close and self.transport is not None:
                self._q_refuse(envelope_bytes(
                    408, "request_timeout", "header_timeout",
                    f"the request line and headers did not arrive within {self._q_header_timeout:g} s (QUEEN_HEADER_TIMEOUT_S)",
                ))
        elif self._current_request is body and not body.content.is_eof() and self.transport is not None:
            self._q_refuse(envelope_bytes(
                408, "request_timeout", "body_timeout",
                f"the request body did not arrive within {self._q_body_timeout:g} s (QUEEN_BODY_TIMEOUT_S)",
            ))

    def _q_refuse(self, raw: bytes) -> None:
        assert self.transport is not None
        try:
            self.transport.write(raw)
        finally:
            self.force_close()

    async def _handle_request(self, request: BaseRequest, start_time: float | None, request_handler: Any) -> Any:
        self._q_cancel()
        if self._q_body_timeout > 0 and not request.content.is_eof():
            self._q_body = request
            self._q_due = self._loop.time() + self._q_body_timeout
        try:
            return await super()._handle_request(request, start_time, request_handler)
        finally:
            self._q_cancel()

    # ---- aiohttp's own answers, in the envelope
    def handle_error(
        self, request: BaseRequest, status: int = 500, exc: BaseException | None = None, message: str | None = None
    ) -> web.StreamResponse:
        if request.writer.output_size > 0:
            raise ConnectionError("the response has started; the connection is broken")
        if status >= 500 and status != 504:
            log.error("unhandled error on %s", request.remote, exc_info=exc)
            return _json(500, "internal", "internal_error", "the broker failed to handle this request; it was logged")
        if status == 504:
            return _json(503, "unavailable", "timeout", "the request did not complete in time; retry", {"Retry-After": "1"})
        log.debug("protocol error from %s: %s", request.remote, message or exc)
        detail = (message or (str(exc) if exc else "") or "malformed HTTP request").splitlines()[0][:300]
        return _json(status, "bad_request", "bad_http", f"the HTTP request is malformed: {detail}")


# How often a worker looks for connections whose header or body clock ran out: a timeout fires up to
# this much after it is due. One timer per worker instead of one armed and cancelled per request (a
# handle created and cancelled for every request was some 4 % of a worker's CPU under 500 producers).
TICK_S = 0.25


class QueenServer(web.Server):
    def __init__(self, *args: Any, limits: Settings, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._q_limits = limits
        self._q_tick: asyncio.TimerHandle | None = None

    def __call__(self) -> RequestHandler:
        if self._q_tick is None and (self._q_limits.header_timeout_s > 0 or self._q_limits.body_timeout_s > 0):
            self._q_tick = self._loop.call_later(TICK_S, self._q_check)
        return QueenRequestHandler(self, loop=self._loop, limits=self._q_limits, **self._kwargs)

    def _q_check(self) -> None:
        """Every TICK_S: answer each connection whose clock ran out (QueenRequestHandler._q_expired)."""
        now = self._loop.time()
        for h in [h for h in self._connections if isinstance(h, QueenRequestHandler) and h._q_due and h._q_due <= now]:
            try:
                h._q_expired()
            except Exception:  # one broken connection must not stop the clock of the others
                log.exception("timing out a connection failed")
        self._q_tick = self._loop.call_later(TICK_S, self._q_check)

    async def shutdown(self, timeout: float | None = None) -> None:
        if self._q_tick is not None:
            self._q_tick.cancel()
        await super().shutdown(timeout)


class QueenRunner(web.AppRunner):
    """``web.AppRunner`` whose connections are ``QueenRequestHandler`` with the settings' timeouts."""

    def __init__(self, app: web.Application, settings: Settings, **kwargs: Any) -> None:
        kwargs.setdefault("keepalive_timeout", float(settings.keepalive_timeout_s))
        super().__init__(app, **kwargs)
        self._q_settings = settings

    async def _make_server(self) -> web.Server:
        plain = await super()._make_server()
        return QueenServer(
            plain.request_handler, request_factory=plain.request_factory,
            handler_cancellation=plain.handler_cancellation, loop=plain._loop, limits=self._q_settings, **plain._kwargs,
        )
