"""``/v1/chat/completions``, ``/v1/completions`` and ``/v1/responses`` (served as the chat
completion it translates to: gateway.responses): auth, validation, tier, admission, relay.
A key clear of its limits has its request sent upstream while its admission is on its
way (``gateway.admission``).

The request body is validated once by pydantic (in Rust) and the upstream body is
serialised once from the validated model. vLLM is always asked for a stream with
continuous usage, so the tokens generated so far are known however the request ends;
streams are relayed with ``model`` and ``service_tier`` rewritten and their chunks
mended where vLLM's break OpenAI's schema (``sse``), and a client that asked for one JSON
answer gets it assembled in vLLM's unstreamed shape, held to the same schema
(``assemble``). ``x-cstack-tier`` names the tier that served the request.

Admission reserves the request's worst case, which must be an upper bound (billing's
promise that no org ends a period more than one request's worst case over its limit rests
on it); ``settle`` then bills vLLM's exact count and releases the rest.

- Prompt tokens, over every prompt of the request, are bounded by the body's length in
  bytes, without running a tokenizer on the hot path: every byte-level BPE token covers
  at least one byte of text, a token id takes at least two bytes of JSON (digit and
  comma), and the JSON around each message is longer than the chat template's tokens for
  it. Tools are the exception: the template adds a preamble once, allowed for by
  ``TOOLS_TEMPLATE_TOKENS``.
- Output tokens: every sequence the request runs (each prompt of a text completion times
  ``n``) may produce ``max_tokens``, capped by the tier and by the engine's context length.
  Reasoning tokens are output tokens inside ``max_tokens``: thinking adds nothing to it.

``reasoning_effort`` and ``verbosity`` reach the model through its chat template
(``chat_template_kwargs``: ``thinking``, always sent because Kimi K2.5's template thinks
unless told not to, and ``verbosity``); an effort that thinks also sends vLLM its
``thinking_token_budget`` from the route (serving/variants.yaml's ``reasoning``), which
the engine enforces by forcing ``</think>``. The template kwargs add at most a few tokens,
fewer than the bytes of the fields that asked for them, so the prompt bound still holds.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pydantic_core
from fastapi import Request
from fastapi.responses import Response
from starlette.requests import ClientDisconnect

from billing.meter import Admission, AdmissionRefused, AdmissionRequest, Meter
from gateway.access.auth import Authenticator
from gateway.admission import AdmissionStanding, refusal_error
from gateway.assemble import Assembler, ChatAssembler, CompletionAssembler
from gateway.errors import GatewayError, bad_request
from gateway.protocol import (
    ChatCompletionRequest,
    ChatMessage,
    CompletionRequest,
    SamplingParams,
    parse_request,
)
from gateway.responses.events import ResponseEventWriter
from gateway.responses.output import ResponseAssembler
from gateway.responses.protocol import ResponsesRequest, as_responses_error
from gateway.server.middleware import CLIENT_REQUEST_ID, REQUEST_ID, TIER
from gateway.settings import GatewaySettings
from gateway.sse import EventWriter, StreamRewriter
from gateway.upstream.exchange import Exchange
from gateway.upstream.relay import Relay
from gateway.upstream.routing import PrefixKey, chat_key, text_key
from gateway.upstream.tiers import TierRoute, TierRouter
from serving.vocabulary import TIERS, Tier

#: Our name of the tier that served a completion: the body's ``service_tier`` is in
#: OpenAI's values (serving.vocabulary.ANSWER_SERVICE_TIERS), which do not name our tiers.
TIER_HEADER = "x-cstack-tier"
_TIER_HEADERS: dict[Tier, tuple[bytes, bytes]] = {
    tier: (TIER_HEADER.encode(), tier.encode()) for tier in TIERS
}
#: A client's name for a conversation: its requests go to the same replica (its cache).
SESSION_HEADER = "x-session-id"
UPSTREAM_STREAM_OPTIONS = {"include_usage": True, "continuous_usage_stats": True}
#: Tokens allowed for what a chat template adds once when a request declares tools (the
#: tiny checkpoint's Hermes-style preamble is about 110; 512 leaves room for longer ones).
TOOLS_TEMPLATE_TOKENS = 512
#: A chat request without ``reasoning_effort`` does not think, as GPT-5.1 defaults to
#: ``none``: clients written before reasoning keep their answers, latency and bills.
DEFAULT_REASONING_EFFORT = "none"


@dataclass(frozen=True)
class Shape:
    """What a request may cost at most, and what vLLM is asked for."""

    upstream_body: bytes
    #: Prompts in the request (a text completion may send a list of them).
    prompts: int
    #: Choices per prompt (``n``).
    n: int
    #: The ``max_tokens`` vLLM is sent: each sequence's most output tokens.
    max_tokens: int
    #: The most output tokens of the whole request: prompts x n x capped max_tokens.
    max_output_tokens: int
    #: An upper bound of the prompt tokens of the whole request.
    prompt_tokens: int


@dataclass(frozen=True)
class Endpoint:
    path: str
    model: type[SamplingParams | ResponsesRequest]
    #: vLLM's route that serves it.
    upstream_path: str


CHAT = Endpoint("/v1/chat/completions", ChatCompletionRequest, "/v1/chat/completions")
COMPLETIONS = Endpoint("/v1/completions", CompletionRequest, "/v1/completions")
#: Served as the chat completion it translates to (gateway.responses).
RESPONSES = Endpoint("/v1/responses", ResponsesRequest, "/v1/chat/completions")


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

    async def handle(self, request: Request, endpoint: Endpoint) -> Response:
        # The maximum duration counts from arrival: auth and admission are part of it.
        deadline = asyncio.get_running_loop().time() + self._settings.max_request_duration_s
        principal = await self._auth.authenticate(request.headers.get("authorization"))
        body = await read_body(request, self._settings.max_body_bytes)
        source = parse_request(endpoint.model, body)
        responses = source if isinstance(source, ResponsesRequest) else None
        parsed = source if isinstance(source, SamplingParams) else source.to_chat()
        route = self._router.resolve(parsed.model, parsed.service_tier, principal.default_tier)
        request.scope[TIER] = route.tier
        try:
            shape = self.shape(parsed, route, len(body))
        except GatewayError as exc:
            raise exc if responses is None else as_responses_error(exc) from None
        request_id: str = request.scope[REQUEST_ID]
        admission_request = AdmissionRequest(
            request_id=request_id,
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
        key_id = principal.key.key_id
        # Made ahead for a busy key (billing.ahead): no round trip to wait for or overlap.
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
            route = self._overflow(parsed, route, shape)
            request.scope[TIER] = route.tier
        exchange = Exchange(
            request_id,
            route,
            principal,
            admission,
            datetime.now(UTC),
            deadline,
            sequences=shape.prompts * shape.n,
            prefix=prefix_key(parsed, request.headers.get(SESSION_HEADER))
            if self._relay.routes_by_prefix(route.tier)
            else None,
            client_request_id=request.scope.get(CLIENT_REQUEST_ID),
        )
        cost = functools.partial(self._relay.usage_cost, exchange)
        # A text completion's choice i answers prompt i // n; a chat has a single prompt.
        per_prompt = shape.n if isinstance(parsed, CompletionRequest) else None
        created = int(exchange.started_at.timestamp())
        path = endpoint.upstream_path
        answer: Callable[[], Awaitable[Response]]
        if parsed.stream:
            writer: EventWriter
            if responses is not None:
                writer = ResponseEventWriter(
                    responses, request_id, created, route.public_model, route.tier, cost=cost
                )
            else:
                options = parsed.stream_options
                writer = StreamRewriter(
                    route.public_model,
                    route.tier,
                    include_usage=bool(options and options.include_usage),
                    continuous_usage=bool(options and options.continuous_usage_stats),
                    choices_per_prompt=per_prompt,
                    cost=cost,
                )
            answer = functools.partial(
                self._relay.stream, exchange, request.receive, path, shape.upstream_body, writer
            )
        else:
            assembler: Assembler
            if responses is not None:
                assembler = ResponseAssembler(responses, request_id, created)
            elif isinstance(parsed, ChatCompletionRequest):
                assembler = ChatAssembler(parsed.tool_choice)
            else:
                assembler = CompletionAssembler(per_prompt)
            answer = functools.partial(
                self._relay.complete,
                exchange,
                request.receive,
                path,
                shape.upstream_body,
                assembler,
            )
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

    def _overflow(self, parsed: SamplingParams, route: TierRoute, shape: Shape) -> TierRoute:
        """The standard route if this fast request overflows, else its own route.

        It keeps the body it was admitted with: admission reserved the fast worst case, an
        upper bound of the same tokens at standard's lower prices, and billing follows the
        tier that served. A request beyond standard's output cap stays fast.
        """
        standard = self._router.route(parsed.model, "standard")
        if shape.max_tokens > standard.max_tokens or standard.priority != route.priority:
            return route
        if not self._relay.overflow_to_standard(shape.prompts * shape.n):
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
        settings = self._settings
        prompts = 1
        prompt_tokens = body_bytes  # an upper bound: see the module docstring
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
            if parsed.tools:
                prompt_tokens += TOOLS_TEMPLATE_TOKENS
            apply_reasoning(body, parsed, route)
        else:
            assert isinstance(parsed, CompletionRequest)
            requested, param = parsed.max_tokens, "max_tokens"
            prompts = prompt_count(parsed.prompt)
            if prompts > settings.max_prompts:
                raise bad_request(
                    f"prompt: at most {settings.max_prompts} prompts per request", param="prompt"
                )
        if requested is not None and requested > route.max_tokens:
            raise bad_request(
                f"{param}: {requested} exceeds the {route.tier} tier's limit of {route.max_tokens}",
                param=param,
            )
        # vLLM refuses a max_tokens above its context length and clamps one below it to the
        # context the prompt leaves, so an unset one is sent as the lower of the two caps.
        context = self._relay.max_model_len(route.tier)
        cap = route.max_tokens if context is None else min(route.max_tokens, context)
        body["max_tokens"] = requested or cap
        n = parsed.n or 1
        if n > settings.max_n:
            raise bad_request(f"n: at most {settings.max_n} choices per request", param="n")
        if not parsed.stream and parsed.stream_options is not None:
            raise bad_request(
                "stream_options: only allowed when stream is true", param="stream_options"
            )
        # Streamed from vLLM in every case: see the module docstring.
        body["stream"] = True
        body["stream_options"] = UPSTREAM_STREAM_OPTIONS
        per_sequence = body["max_tokens"] if context is None else min(body["max_tokens"], context)
        return Shape(
            upstream_body=pydantic_core.to_json(body),
            prompts=prompts,
            n=n,
            max_tokens=per_sequence,
            max_output_tokens=per_sequence * n * prompts,
            prompt_tokens=prompt_tokens,
        )


def apply_reasoning(body: dict[str, Any], parsed: ChatCompletionRequest, route: TierRoute) -> None:
    """``reasoning_effort`` and ``verbosity`` as vLLM takes them (see the module docstring)."""
    budget = route.thinking_budgets.get(parsed.reasoning_effort or DEFAULT_REASONING_EFFORT)
    kwargs: dict[str, Any] = {"thinking": budget is not None}
    if parsed.verbosity is not None:
        kwargs["verbosity"] = parsed.verbosity
    body["chat_template_kwargs"] = kwargs
    if budget is not None:
        body["thinking_token_budget"] = budget


def prefix_key(parsed: SamplingParams, session: str | None) -> PrefixKey:
    """The request's prompt prefix and session, for prefix-aware routing."""
    session = session or parsed.user
    if isinstance(parsed, ChatCompletionRequest):
        # The template renders the tools and the verbosity line before the messages.
        seed = pydantic_core.to_json(parsed.tools) if parsed.tools else b""
        if parsed.verbosity is not None:
            seed += parsed.verbosity.encode()
        return chat_key([message_block(m) for m in parsed.messages], seed, session)
    assert isinstance(parsed, CompletionRequest)
    prompt = parsed.prompt
    if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int):
        prompt = prompt[0]  # several prompts: the first decides
    return text_key(prompt, session)  # type: ignore[arg-type]


def message_block(message: ChatMessage) -> bytes:
    """What of a message its prefix hash covers: what the chat template renders of it.
    (Cheaper than serialising the model: this runs per message of every request.)"""
    content = message.content
    if isinstance(content, list):
        content = "".join(part.text for part in content)
    parts = [message.role, message.name or "", content or "", message.tool_call_id or ""]
    block = "\0".join(parts).encode()
    if message.tool_calls:
        block += pydantic_core.to_json(message.tool_calls)
    return block


def prompt_count(prompt: str | list[str] | list[int] | list[list[int]]) -> int:
    """How many prompts a text completion sends: a string or one list of token ids is one
    prompt, a list of strings or of token-id lists is one prompt per item."""
    if isinstance(prompt, str) or not prompt or isinstance(prompt[0], int):
        return 1
    return len(prompt)


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
