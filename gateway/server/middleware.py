"""Pure ASGI middleware: request ids, request metrics, a last-resort error body, and which
routes each listener serves.

Written against raw ASGI rather than ``BaseHTTPMiddleware`` because it sits on the hot
path of every request and must not buffer or re-wrap streaming bodies.
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import re
import secrets
import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.errors import GatewayError, route_error
from gateway.metrics import GatewayMetrics

logger = logging.getLogger(__name__)

#: The gateway's own unique id per request (billing's idempotency key, upstream's id).
REQUEST_ID = "cstack.request_id"
#: The client's own ``x-request-id``, when it sent a valid one (kept on its receipt).
CLIENT_REQUEST_ID = "cstack.client_request_id"
#: ``time.perf_counter()`` when the request arrived (the gateway's overhead counts from it).
ARRIVED = "cstack.arrived"
#: The tier that served the request, once known (metrics label).
TIER = "cstack.tier"
ROUTES = {
    "/v1/chat/completions": "chat",
    "/v1/completions": "completions",
    "/v1/responses": "responses",
    "/v1/models": "models",
    "/v1/usage": "usage",
}
CLIENT_REQUEST_ID_FORM = re.compile(rb"^[\x21-\x7e]{1,128}$")


class RequestContextMiddleware:
    def __init__(self, app: ASGIApp, metrics: GatewayMetrics) -> None:
        self.app = app
        self.metrics = metrics
        # Unique across replicas and restarts without an os.urandom call per request, and
        # telling nothing: a process secret keys a hash of a per-process counter (ids that
        # count up would let any customer measure every tenant's request rate).
        self._id_key = secrets.token_bytes(32)
        self._counter = itertools.count()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        serial = next(self._counter).to_bytes(8, "little")
        own_id = "req_" + hashlib.blake2b(serial, key=self._id_key, digest_size=16).hexdigest()
        scope[REQUEST_ID] = own_id
        scope[ARRIVED] = started
        # A client's own id is echoed back (it is theirs to correlate with), but billing
        # and upstreams use the gateway's: a client could reuse ids and dedupe its usage.
        header_id = own_id.encode()
        for name, value in scope["headers"]:
            if name == b"x-request-id":
                if CLIENT_REQUEST_ID_FORM.match(value):
                    header_id = value
                    scope[CLIENT_REQUEST_ID] = value.decode()
                break
        status = 500
        response_started = False

        async def send_with_id(message: Message) -> None:
            nonlocal status, response_started
            if message["type"] == "http.response.start":
                response_started = True
                status = message["status"]
                message["headers"] = [*message.get("headers", ()), (b"x-request-id", header_id)]
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        except Exception:
            logger.exception("unhandled error serving request %s", own_id)
            if not response_started:
                error = GatewayError(
                    500, "internal gateway error", type="server_error", code="internal_error"
                )
                await error.response()(scope, receive, send_with_id)
        finally:
            path = scope["path"]
            route = ROUTES.get(path) or ("usage" if path.startswith("/v1/usage/") else "other")
            tier = scope.get(TIER, "none")
            self.metrics.count_request(tier, route, status, time.perf_counter() - started)


#: Routes served on both listeners (Kubernetes probes whichever port they are given).
PROBES = frozenset({"/healthz", "/readyz"})


def is_internal_route(path: str) -> bool:
    return path == "/metrics" or path == "/admin" or path.startswith("/admin/")


class ListenerGuard:
    """``/metrics`` and ``/admin/`` on the internal port only, everything else but the
    probes on the public port only; the wrong listener answers 404, as for no route."""

    def __init__(self, app: ASGIApp, internal_port: int) -> None:
        self.app = app
        self.internal_port = internal_port

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] not in PROBES:
            server = scope.get("server")
            on_internal = server is not None and server[1] == self.internal_port
            if on_internal != is_internal_route(scope["path"]):
                error = route_error(scope["method"], scope["path"], 404, "Not Found")
                await error.response()(scope, receive, send)
                return
        await self.app(scope, receive, send)
