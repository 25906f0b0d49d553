"""OpenAI's error body, ``{"error": {"message", "type", "param", "code"}}``, for every failure.

Clients (the openai SDK included) turn this body into typed exceptions, so every error
the gateway answers, its own or an upstream's, goes out in exactly this shape.
"""

from __future__ import annotations

from typing import Any

import pydantic_core
from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from starlette.exceptions import HTTPException as StarletteHTTPException

#: The longest message or param an error repeats: messages quote client values through
#: ``serving.redact.echo``; this is the backstop for any that does not.
MAX_MESSAGE_CHARS = 1000
MAX_PARAM_CHARS = 200


class GatewayError(Exception):
    """An error the gateway answers with, in OpenAI's shape."""

    def __init__(
        self,
        status_code: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        if len(message) > MAX_MESSAGE_CHARS:
            message = message[:MAX_MESSAGE_CHARS] + "... (cut)"
        super().__init__(message)
        self.status_code = status_code
        self.message = message
        self.type = type
        self.param = param[:MAX_PARAM_CHARS] if param is not None else None
        self.code = code
        self.headers = dict(headers or {})

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.type, self.param, self.code)

    def response(self) -> Response:
        return Response(
            pydantic_core.to_json(self.body()),
            status_code=self.status_code,
            media_type="application/json",
            headers=self.headers,
        )


def error_body(
    message: str, type: str, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def bad_request(message: str, param: str | None = None, code: str | None = None) -> GatewayError:
    return GatewayError(400, message, param=param, code=code)


def unauthorized(message: str) -> GatewayError:
    return GatewayError(401, message, code="invalid_api_key")


def upstream_unavailable(message: str, status_code: int = 503) -> GatewayError:
    return GatewayError(status_code, message, type="server_error", code="upstream_unavailable")


async def gateway_error_handler(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, GatewayError)
    return exc.response()


async def http_exception_handler(request: Request, exc: Exception) -> Response:
    """Starlette's own 404/405 (unknown routes, wrong methods) in OpenAI's shape."""
    assert isinstance(exc, StarletteHTTPException)
    error = route_error(request.method, request.url.path, exc.status_code, exc.detail)
    error.headers.update(exc.headers or {})  # 405 carries Allow
    return error.response()


def route_error(method: str, path: str, status_code: int, detail: str) -> GatewayError:
    """No such route (404), or not with this method (405): the request line, cut, named."""
    code = {404: "not_found", 405: "method_not_allowed"}.get(status_code)
    return GatewayError(status_code, f"{method} {path[:200]}: {detail}", code=code)


async def validation_error_handler(request: Request, exc: Exception) -> Response:
    """FastAPI's parameter validation (admin API bodies, query strings) as a 400."""
    assert isinstance(exc, RequestValidationError)
    first = exc.errors()[0] if exc.errors() else {}
    param = ".".join(str(part) for part in first.get("loc", ())[1:]) or None
    message = f"{param or 'request'}: {first.get('msg', 'invalid value')}"
    return bad_request(message, param=param).response()
