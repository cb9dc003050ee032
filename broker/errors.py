"""One exception hierarchy, one JSON error envelope.

Every refusal the broker makes is an ``ApiError`` rendered as
``{"error": <code>, "reason": <stable id>, "detail": <prose>}`` with its HTTP status and headers.
The status classes follow one rule: 400 malformed, 401 unauthenticated, 403 retry for ever and it will
not help, 404 no such route, 413 too large, 429 retry later (``Retry-After``), 503 not your fault
(``Retry-After``). Handlers and domain code raise; the error middleware renders.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import cast

import orjson

TIMERS_HINT_HEADER = "x-queen-timers-hint"
TIMERS_HINT_VALUE = "DELETE /api/v1/timers/:queue/*timerKey"


class ApiError(Exception):
    status: int = 400
    code: str = "bad_request"

    def __init__(
        self,
        reason: str,
        detail: str,
        *,
        code: str | None = None,
        status: int | None = None,
        headers: Mapping[str, str] | None = None,
        extra: Mapping[str, object] | None = None,
    ) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail
        if code is not None:
            self.code = code
        if status is not None:
            self.status = status
        self.headers: dict[str, str] = dict(headers or {})
        self.extra: dict[str, object] = dict(extra or {})

    def envelope(self) -> dict[str, object]:
        body: dict[str, object] = {"error": self.code, "reason": self.reason, "detail": self.detail}
        body.update(self.extra)
        return body

    def body(self) -> bytes:
        return orjson.dumps(self.envelope())

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.status} {self.code}/{self.reason}: {self.detail})"


class BadRequest(ApiError):
    status = 400
    code = "bad_request"


class Unauthenticated(ApiError):
    status = 401
    code = "unauthenticated"


class Forbidden(ApiError):
    """403: a verdict that retrying will not change (missing grant, plan limit, suspension)."""

    status = 403
    code = "forbidden"


class NotFound(ApiError):
    status = 404
    code = "not_found"


class MethodNotAllowed(ApiError):
    status = 405
    code = "method_not_allowed"


class Conflict(ApiError):
    status = 409
    code = "conflict"


class PayloadTooLarge(ApiError):
    status = 413
    code = "payload_too_large"


class UnsupportedMediaType(ApiError):
    status = 415
    code = "unsupported_media_type"


class TooManyRequests(ApiError):
    """429: retry later. Always carries Retry-After (whole seconds)."""

    status = 429
    code = "rate_limited"

    def __init__(self, reason: str, detail: str, *, retry_after_s: float = 1, **kw: object) -> None:
        headers = dict(cast("Mapping[str, str] | None", kw.pop("headers", None)) or {})
        headers["Retry-After"] = str(max(1, int(retry_after_s + 0.999)))
        super().__init__(reason, detail, headers=headers, **kw)  # type: ignore[arg-type]


class Unavailable(ApiError):
    """503: not your fault. Always carries Retry-After."""

    status = 503
    code = "unavailable"

    def __init__(self, reason: str, detail: str, *, retry_after_s: float = 1, **kw: object) -> None:
        headers = dict(cast("Mapping[str, str] | None", kw.pop("headers", None)) or {})
        headers["Retry-After"] = str(max(1, int(retry_after_s + 0.999)))
        super().__init__(reason, detail, headers=headers, **kw)  # type: ignore[arg-type]


def booting(detail: str = "the broker is starting: migrations or the database pool are not ready") -> Unavailable:
    return Unavailable("booting", detail, code="booting", retry_after_s=1)


def internal_envelope() -> bytes:
    return orjson.dumps(
        {"error": "internal", "reason": "internal_error", "detail": "the broker failed to handle this request; it was logged"}
    )
