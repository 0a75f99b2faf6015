"""Every error the API returns, mapped in one place, as ``{"error": {type, message, field}}``.

Stepstone errors map by class (``NotFoundError`` 404, ``InvalidStateError`` 409,
``LimitExceededError`` 413, configuration and event errors 422, ...); request
validation failures become 422 naming the field (an unknown field too, as an
unknown query parameter), malformed or missing JSON 400 ``MalformedRequest``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from stepstone.errors import (
    AuthenticationError,
    ConfigError,
    EndpointError,
    ExpressionError,
    InvalidStateError,
    LimitExceededError,
    NotFoundError,
    RunTimeoutError,
    SerializationError,
    StepstoneError,
    StoreError,
    StoreUnavailableError,
)
from stepstone.events import InvalidEventError
from stepstone.server.schemas import ErrorBody, ErrorDetail

log = logging.getLogger("stepstone.server")


# First match wins: subclasses before their bases.
_STATUS: Sequence[tuple[type[BaseException], int]] = (
    (AuthenticationError, 401),
    (NotFoundError, 404),
    (InvalidStateError, 409),
    (LimitExceededError, 413),
    (ConfigError, 422),
    (InvalidEventError, 422),
    (ExpressionError, 422),
    (SerializationError, 422),
    (EndpointError, 502),
    (RunTimeoutError, 504),
    (StoreUnavailableError, 503),
    (StoreError, 500),
    (StepstoneError, 400),
)

_HTTP_TYPES = {
    401: "AuthenticationError",
    403: "Forbidden",
    404: "NotFoundError",
    405: "MethodNotAllowed",
    413: "LimitExceededError",
}


def status_for(exc: BaseException) -> int:
    for kind, status in _STATUS:
        if isinstance(exc, kind):
            return status
    return 500


def error_response(
    status: int, type_: str, message: str, field: str | None = None, headers: Mapping[str, str] | None = None
) -> JSONResponse:
    body = ErrorBody(error=ErrorDetail(type=type_, message=message, field=field))
    if status == 401:
        headers = {**(headers or {}), "WWW-Authenticate": "Bearer"}
    return JSONResponse(body.model_dump(), status_code=status, headers=headers)


async def _stepstone_error(request: Request, exc: Exception) -> JSONResponse:
    status = status_for(exc)
    if status >= 500:
        log.error("%s %s failed: %s", request.method, request.url.path, exc, exc_info=exc)
    return error_response(status, type(exc).__name__, str(exc), getattr(exc, "field", None))


def _field(loc: Sequence[Any]) -> str:
    parts = [
        p
        for p in loc
        if p not in ("body", "query", "path", "header") and not (isinstance(p, str) and p.startswith("("))
    ]  # union tags
    text = ""
    for part in parts:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text or "body"


async def _validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    if isinstance(exc.body, bytes | bytearray):  # FastAPI parses only JSON content types
        return error_response(
            415, "MalformedRequest", "expected a JSON body with 'Content-Type: application/json'"
        )
    errors = list(exc.errors())
    malformed = [e for e in errors if e.get("type") == "json_invalid"]
    if malformed:
        detail = malformed[0].get("ctx", {}).get("error", "invalid JSON")
        return error_response(400, "MalformedRequest", f"malformed JSON: {detail}")
    first = errors[0] if errors else {"loc": ("body",), "msg": "invalid request"}
    if first.get("type") == "missing" and tuple(first.get("loc", ())) == ("body",):
        return error_response(400, "MalformedRequest", "malformed JSON: the body is empty")
    field = _field(first.get("loc", ()))
    message = "unknown field" if first.get("type") == "extra_forbidden" else first.get("msg")
    more = f" (and {len(errors) - 1} more problem(s))" if len(errors) > 1 else ""
    return error_response(422, "ConfigError", f"{field}: {message}{more}", field)


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    kind = _HTTP_TYPES.get(exc.status_code, "HTTPError")
    return error_response(exc.status_code, kind, str(exc.detail), headers=exc.headers)


async def _unicode_error(request: Request, exc: Exception) -> JSONResponse:
    return error_response(400, "MalformedRequest", f"text is not valid Unicode: {exc}")


async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
    log.error("%s %s crashed", request.method, request.url.path, exc_info=exc)
    return error_response(500, "InternalError", "internal error; see the server log")


def install(api: FastAPI) -> None:
    api.add_exception_handler(StepstoneError, _stepstone_error)
    api.add_exception_handler(RequestValidationError, _validation_error)
    api.add_exception_handler(StarletteHTTPException, _http_error)
    api.add_exception_handler(UnicodeError, _unicode_error)
    api.add_exception_handler(Exception, _unexpected)


def documented(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses=`` entries for error statuses."""
    return {status: {"model": ErrorBody, "description": _DESCRIPTIONS[status]} for status in statuses}


_DESCRIPTIONS = {
    400: "Malformed request (invalid JSON or text)",
    401: "Missing or invalid bearer key",
    404: "No such resource",
    409: "The operation does not apply to the resource's current state",
    413: "Payload over a documented limit",
    415: "The body is not JSON (`Content-Type: application/json`)",
    422: "A field is invalid; `error.field` names it",
    502: "An app's endpoint could not be reached, refused the signature or answered wrongly",
    503: "The database is unavailable",
}
