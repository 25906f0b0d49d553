"""The generation routes (chat, completions, responses) served straight from ASGI.

They carry nearly all of the gateway's traffic. Through Starlette, each request first
passed Starlette's exception middleware, FastAPI's exit stack, the router (each route's
pattern tried in turn) and the route's own exception wrapper: 6-7% of a billed request's
CPU (py-spy under ``bench/gateway_overhead.py``), for a handler that needs none of them.
Here one dict lookup finds the endpoint, the handler's ``GatewayError`` becomes its OpenAI
error body as the app's exception handler would make it, and every other path goes on to
the app (its routes, its 404s). Sits inside the listener guard and the request context
(``gateway.server.middleware``): the public listener only, request ids and metrics as for
any route; anything else the handler raises reaches the request context's last-resort 500.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from gateway.api.endpoints import Endpoint
from gateway.api.handler import GenerationHandler
from gateway.errors import GatewayError, route_error


class GenerationRoutes:
    """ASGI middleware: ``POST`` to an endpoint's path is the handler's; another method
    there is a 405 naming the allowed one; any other path is the wrapped app's."""

    def __init__(
        self, app: ASGIApp, handler: GenerationHandler, endpoints: Iterable[Endpoint[Any]]
    ) -> None:
        self.app = app
        self._handler = handler
        self._endpoints = {endpoint.path: endpoint for endpoint in endpoints}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        endpoint = self._endpoints.get(scope["path"]) if scope["type"] == "http" else None
        if endpoint is None:
            await self.app(scope, receive, send)
            return
        if scope["method"] != "POST":
            error = route_error(scope["method"], scope["path"], 405, "Method Not Allowed")
            error.headers["allow"] = "POST"
            await error.response()(scope, receive, send)
            return
        try:
            response = await self._handler.handle(Request(scope, receive), endpoint)
        except GatewayError as exc:
            response = exc.response()
        await response(scope, receive, send)
