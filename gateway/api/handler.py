"""``/v1/chat/completions``, ``/v1/completions`` and ``/v1/responses`` (served as the chat
completion it translates to: gateway.api.responses): auth, validation, tier, admission, relay.
A key clear of its limits has its request sent upstream while its admission is on its
way (``gateway.api.admission``).

The request body is validated once by pydantic (in Rust) and the upstream body is
serialised once from the validated model. vLLM is always asked for a stream with
continuous usage, so the tokens generated so far are known however the request ends (to
within a chunk: ``shaping.UNSTREAMED_STREAM_INTERVAL`` for an answer assembled whole);
streams are relayed with ``model`` and ``service_tier`` rewritten and their chunks
mended where vLLM's break OpenAI's schema (``stream``), and a client that asked for one
JSON answer gets it assembled in vLLM's unstreamed shape, held to the same schema
(``answers``). ``x-cstack-tier`` names the tier that served the request. Each endpoint
(``endpoints``) says how its request is parsed, which vLLM route serves it and which writer
or assembler answers it; what a request may cost and the body vLLM gets are ``shaping``'s.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import TypeVar

from fastapi import Request
from fastapi.responses import Response
from pydantic import BaseModel
from starlette.types import Scope

from billing.contract import Admission, AdmissionRefused, AdmissionRequest, Meter
from gateway.access.auth import Authenticator, Principal
from gateway.api.admission import AdmissionStanding, refusal_error
from gateway.api.downstream import Client
from gateway.api.endpoints import AnswerContext, Endpoint
from gateway.api.exchange import Exchange
from gateway.api.protocol import SamplingParams
from gateway.api.relay import Relay
from gateway.api.shaping import Shape, prefix_key, shape_request
from gateway.errors import GatewayError, bad_request
from gateway.server.middleware import ARRIVED, CLIENT_REQUEST_ID, REQUEST_ID, TIER
from gateway.settings import GatewaySettings
from gateway.upstream.tiers import TierRoute, TierRouter
from serving.vocabulary import TIERS, Tier

RequestT = TypeVar("RequestT", bound=BaseModel)

#: Our name of the tier that served a completion: the body's ``service_tier`` is in
#: OpenAI's values (serving.vocabulary.ANSWER_SERVICE_TIERS), which do not name our tiers.
TIER_HEADER = "x-cstack-tier"
_TIER_HEADERS: dict[Tier, tuple[bytes, bytes]] = {
    tier: (TIER_HEADER.encode(), tier.encode()) for tier in TIERS
}
#: A client's name for a conversation: its requests go to the same replica (its cache).
SESSION_HEADER = "x-session-id"
_SESSION = SESSION_HEADER.encode()
#: The request headers the handler reads (``request_headers``).
_READ = frozenset({b"authorization", b"content-length", _SESSION})


class GenerationHandler:
    def __init__(
        self,
        settings: GatewaySettings,
        auth: Authenticator,
        router: TierRouter,
        meter: Meter,
        relay: Relay,
    ) -> None:
        self._settings = settings
        self._auth = auth
        self._router = router
        self._meter = meter
        self._relay = relay
        self._standing = AdmissionStanding()

    async def handle(self, request: Request, endpoint: Endpoint[RequestT]) -> Response:
        # The maximum duration counts from arrival: auth and admission are part of it.
        deadline = asyncio.get_running_loop().time() + self._settings.max_request_duration_s
        headers = request_headers(request.scope)
        principal = await self._auth.authenticate(headers.get(b"authorization"))
        body = await read_body(request, self._settings.max_body_bytes, headers)
        source = endpoint.parse(body)
        parsed = endpoint.sampling(source)
        route = self._router.resolve(parsed.model, parsed.service_tier, principal.default_tier)
        request.scope[TIER] = route.tier
        try:
            shape = self.shape(parsed, route, len(body))
        except GatewayError as exc:
            raise endpoint.client_error(exc) from None
        admission_request = self._admission_request(request, principal, route, shape)
        key_id = principal.key.key_id
        # On a busy key's lease (billing's leases): no round trip to wait for or overlap.
        admission = self._meter.admit_ready(admission_request)
        if admission is not None:
            self._standing.granted(key_id, admission)
        overlapped = (
            admission is None
            and self._settings.overlap_admission
            and self._standing.overlaps(key_id)
        )
        if admission is None and not overlapped:
            try:
                admission = await self._admit(admission_request)
            except AdmissionRefused as refused:
                raise refusal_error(refused) from None
        if route.tier == "fast" and principal.fast_overflow:
            route = self._overflow(parsed, route, shape, principal.key.org_id)
            request.scope[TIER] = route.tier
        exchange = self._exchange(
            request, headers, route, principal, admission, deadline, parsed, shape
        )
        answer = self._answer(request, endpoint, source, parsed, exchange, shape)
        if overlapped:
            # Started last: from here the relay owns it, and settles it however the request
            # ends. Counted from here (nothing awaited since the decision) until it is back.
            self._standing.started(key_id)
            exchange.admitting = asyncio.get_running_loop().create_task(
                self._admit(admission_request, overlapped=True)
            )
        try:
            response = await answer()
        except GatewayError as exc:
            exc.headers = {**exchange.headers, **exc.headers, TIER_HEADER: route.tier}
            raise
        # Appended raw: building MutableHeaders for one header costs more on the hot path.
        response.raw_headers.append(_TIER_HEADERS[route.tier])
        return response

    def _admission_request(
        self, request: Request, principal: Principal, route: TierRoute, shape: Shape
    ) -> AdmissionRequest:
        return AdmissionRequest(
            request_id=request.scope[REQUEST_ID],
            org_id=principal.key.org_id,
            key_id=principal.key.key_id,
            plan=principal.key.plan,
            tier=route.tier,
            model=route.public_model,
            prompt_tokens=shape.prompt_tokens,
            max_output_tokens=shape.max_output_tokens,
            customer_id=principal.customer_id,
            max_duration_s=self._settings.max_request_duration_s,
        )

    def _exchange(
        self,
        request: Request,
        headers: dict[bytes, str],
        route: TierRoute,
        principal: Principal,
        admission: Admission | None,
        deadline: float,
        parsed: SamplingParams,
        shape: Shape,
    ) -> Exchange:
        return Exchange(
            request.scope[REQUEST_ID],
            route,
            principal,
            admission,
            datetime.now(UTC),
            deadline,
            sequences=shape.prompts * shape.n,
            prefix=prefix_key(parsed, headers.get(_SESSION))
            if self._relay.routes_by_prefix(route.tier)
            else None,
            client_request_id=request.scope.get(CLIENT_REQUEST_ID),
            arrived=request.scope.get(ARRIVED, time.perf_counter()),
        )

    def _answer(
        self,
        request: Request,
        endpoint: Endpoint[RequestT],
        source: RequestT,
        parsed: SamplingParams,
        exchange: Exchange,
        shape: Shape,
    ) -> Callable[[], Awaitable[Response]]:
        """The relay call that answers: streamed through the endpoint's writer, or
        assembled by its assembler."""
        context = AnswerContext(
            exchange.request_id,
            int(exchange.started_at.timestamp()),
            exchange.route,
            shape.n,
            functools.partial(self._relay.usage_cost, exchange),
        )
        client = Client(request.scope, request.receive)
        if parsed.stream:
            return functools.partial(
                self._relay.stream,
                exchange,
                client,
                endpoint.upstream_path,
                shape.upstream_body,
                endpoint.writer(source, context),
            )
        return functools.partial(
            self._relay.complete,
            exchange,
            client,
            endpoint.upstream_path,
            shape.upstream_body,
            endpoint.assembler(source, context),
        )

    def _overflow(
        self, parsed: SamplingParams, route: TierRoute, shape: Shape, org: str
    ) -> TierRoute:
        """The standard route if this fast request overflows, else its own route.

        It keeps the body it was admitted with: admission reserved the fast worst case, an
        upper bound of the same tokens at standard's lower prices, and billing follows the
        tier that served. A request beyond standard's output cap stays fast.
        """
        standard = self._router.route(parsed.model, "standard")
        if shape.max_tokens > standard.max_tokens or standard.priority != route.priority:
            return route
        if not self._relay.overflow_to_standard(shape.prompts * shape.n, org):
            return route
        return standard

    async def _admit(
        self, admission_request: AdmissionRequest, *, overlapped: bool = False
    ) -> Admission:
        """Billing's admission; whether the key's next request may be overlapped with its
        own follows the outcome."""
        key_id = admission_request.key_id
        try:
            admission = await self._meter.admit(admission_request)
        except AdmissionRefused:
            self._standing.refused(key_id)
            raise
        finally:
            if overlapped:
                self._standing.ended(key_id)
        self._standing.granted(key_id, admission)
        return admission

    def shape(self, parsed: SamplingParams, route: TierRoute, body_bytes: int) -> Shape:
        """The body vLLM gets, and the most the request may cost (for admission)."""
        context = self._relay.max_model_len(route.tier)
        return shape_request(parsed, route, body_bytes, self._settings, context)


def request_headers(scope: Scope) -> dict[bytes, str]:
    """The request headers the handler reads (the first of each), in one pass over the
    raw headers: Starlette's ``Headers`` scans them once per lookup."""
    found: dict[bytes, str] = {}
    for name, value in scope["headers"]:
        if name in _READ and name not in found:
            found[name] = value.decode("latin-1")
    return found


async def read_body(request: Request, limit: int, headers: dict[bytes, str]) -> bytes:
    """The request's body, read from ASGI's messages (Starlette's body stream adds an
    async generator and a step per request for the same bytes)."""
    declared = headers.get(b"content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise _too_large(limit)
    chunks: list[bytes] = []
    size = 0
    receive = request.receive
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise bad_request("client disconnected while sending the body")
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise _too_large(limit)
        chunks.append(chunk)
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def _too_large(limit: int) -> GatewayError:
    return GatewayError(413, f"request body exceeds {limit} bytes", code="request_too_large")
