"""``/v1/chat/completions`` and ``/v1/completions``: auth, validation, tier, admission, relay.

The request body is validated once by pydantic (in Rust) and the upstream body is
serialised once from the validated model; responses are relayed with only ``model`` and
``service_tier`` rewritten.

Prompt tokens for admission are bounded by the request body's length in bytes, without
running a tokenizer on the hot path: every byte-level BPE token covers at least one byte
of text, and the JSON around each message is longer than the chat template's tokens for
it. The reservation must be an upper bound (billing's promise that no org ends a period
more than one request's worst case over its limit rests on it); ``settle`` then bills
vLLM's exact count and releases the rest.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pydantic_core
from fastapi import Request
from fastapi.responses import Response
from starlette.requests import ClientDisconnect

from billing.meter import Admission, AdmissionRefused, AdmissionRequest, Meter
from gateway.auth import Authenticator
from gateway.errors import GatewayError, bad_request
from gateway.middleware import REQUEST_ID, TIER
from gateway.protocol import ChatCompletionRequest, CompletionRequest, SamplingParams, parse_request
from gateway.relay import Exchange, Relay
from gateway.settings import GatewaySettings
from gateway.sse import StreamRewriter
from gateway.tiers import TierRoute, TierRouter

UPSTREAM_STREAM_OPTIONS = {"include_usage": True, "continuous_usage_stats": True}


@dataclass(frozen=True)
class Endpoint:
    path: str
    model: type[SamplingParams]


CHAT = Endpoint("/v1/chat/completions", ChatCompletionRequest)
COMPLETIONS = Endpoint("/v1/completions", CompletionRequest)


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

    async def handle(self, request: Request, endpoint: Endpoint) -> Response:
        principal = await self._auth.authenticate(request.headers.get("authorization"))
        body = await read_body(request, self._settings.max_body_bytes)
        parsed = parse_request(endpoint.model, body)
        route = self._router.resolve(parsed.model, parsed.service_tier)
        request.scope[TIER] = route.tier
        upstream_body, max_output = self.upstream_body(parsed, route)
        request_id: str = request.scope[REQUEST_ID]
        admission_request = AdmissionRequest(
            request_id=request_id,
            org_id=principal.key.org_id,
            key_id=principal.key.key_id,
            plan=principal.key.plan,
            tier=route.tier,
            model=route.public_model,
            prompt_tokens=len(body),  # an upper bound: see the module docstring
            max_output_tokens=max_output,
            customer_id=principal.customer_id,
        )
        admission = await self._admit(admission_request)
        exchange = Exchange(request_id, route, principal, admission, datetime.now(UTC))
        try:
            if parsed.stream:
                options = parsed.stream_options
                rewriter = StreamRewriter(
                    route.public_model,
                    route.tier,
                    include_usage=bool(options and options.include_usage),
                    continuous_usage=bool(options and options.continuous_usage_stats),
                )
                return await self._relay.stream(
                    exchange, request.receive, endpoint.path, upstream_body, rewriter
                )
            return await self._relay.complete(
                exchange, request.receive, endpoint.path, upstream_body
            )
        except GatewayError as exc:
            exc.headers = {**admission.headers, **exc.headers}
            raise

    async def _admit(self, admission_request: AdmissionRequest) -> Admission:
        try:
            return await self._meter.admit(admission_request)
        except AdmissionRefused as refused:
            headers = dict(refused.headers)
            if refused.retry_after_s is not None:
                headers["retry-after"] = str(refused.retry_after_s)
            error_type = (
                "insufficient_quota" if refused.code == "insufficient_quota" else "requests"
            )
            raise GatewayError(
                refused.status_code,
                refused.message,
                type=error_type,
                code=refused.code,
                headers=headers,
            ) from None

    def upstream_body(self, parsed: SamplingParams, route: TierRoute) -> tuple[bytes, int]:
        """The body vLLM gets, and the most output tokens it may produce (for admission)."""
        settings = self._settings
        body: dict[str, Any] = parsed.model_dump(exclude_unset=True, exclude_none=True)
        body.pop("service_tier", None)
        body["model"] = route.served_model
        if route.priority is not None:
            body["priority"] = route.priority
        if isinstance(parsed, ChatCompletionRequest):
            if len(parsed.messages) > settings.max_messages:
                raise bad_request(
                    f"messages: at most {settings.max_messages} messages per request",
                    param="messages",
                )
            requested = parsed.max_completion_tokens or parsed.max_tokens
            param = "max_completion_tokens" if parsed.max_completion_tokens else "max_tokens"
            body.pop("max_completion_tokens", None)
        else:
            requested, param = parsed.max_tokens, "max_tokens"
        if requested is not None and requested > route.max_tokens:
            raise bad_request(
                f"{param}: {requested} exceeds the {route.tier} tier's limit of {route.max_tokens}",
                param=param,
            )
        # vLLM clamps max_tokens to the context left, so the cap is always safe to send.
        body["max_tokens"] = requested or route.max_tokens
        n = parsed.n or 1
        if n > settings.max_n:
            raise bad_request(f"n: at most {settings.max_n} choices per request", param="n")
        if parsed.stream:
            body["stream_options"] = UPSTREAM_STREAM_OPTIONS
        elif parsed.stream_options is not None:
            raise bad_request(
                "stream_options: only allowed when stream is true", param="stream_options"
            )
        return pydantic_core.to_json(body), body["max_tokens"] * n


async def read_body(request: Request, limit: int) -> bytes:
    too_large = GatewayError(413, f"request body exceeds {limit} bytes", code="request_too_large")
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise too_large
    chunks: list[bytes] = []
    size = 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise too_large
            chunks.append(chunk)
    except ClientDisconnect:
        raise bad_request("client disconnected while sending the body") from None
    return b"".join(chunks)
