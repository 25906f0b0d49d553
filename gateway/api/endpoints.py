"""The generation endpoints as objects: each carries its request model, the vLLM route
that serves it, and the writer of its streamed answers and assembler of its unstreamed
ones. ``handler.GenerationHandler`` serves every endpoint the same way through them.

Chat and text completions go to vLLM as they are; ``/v1/responses`` is served as the chat
completion it translates to (``gateway.api.responses.endpoint``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Generic, TypeVar

from pydantic import BaseModel

from gateway.api.answers import Assembler, ChatAssembler, CompletionAssembler
from gateway.api.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    SamplingParams,
    parse_request,
)
from gateway.api.stream import EventWriter, StreamRewriter, UsageCost
from gateway.errors import GatewayError
from gateway.upstream.tiers import TierRoute

RequestT = TypeVar("RequestT", bound=BaseModel)


@dataclass(slots=True)
class AnswerContext:
    """What an answer's writer or assembler needs to know of the request it answers.
    Read-only once made (not ``frozen``: a frozen dataclass costs 4x to make, per request)."""

    request_id: str
    #: Unix seconds at which the request started (a Response's ``created_at``).
    created: int
    route: TierRoute
    #: Choices per prompt (``n``).
    n: int
    #: The request's cost from the usage it will be billed on.
    cost: UsageCost


class Endpoint(ABC, Generic[RequestT]):
    """One generation route: its request as the client sends it, and what answers it."""

    #: The gateway's route.
    path: str
    #: vLLM's route that serves it.
    upstream_path: str
    model: type[RequestT]

    def parse(self, body: bytes) -> RequestT:
        """The validated request (a 400 naming the parameter at fault otherwise)."""
        return parse_request(self.model, body)

    @abstractmethod
    def sampling(self, request: RequestT) -> SamplingParams:
        """The chat or text completion vLLM is asked for."""

    @abstractmethod
    def writer(self, request: RequestT, context: AnswerContext) -> EventWriter:
        """What turns vLLM's stream into the client's, for a streamed request."""

    @abstractmethod
    def assembler(self, request: RequestT, context: AnswerContext) -> Assembler:
        """What builds one answer from vLLM's stream, for an unstreamed request."""

    def client_error(self, exc: GatewayError) -> GatewayError:
        """A refusal of the sampling request, as this endpoint's client named things."""
        return exc


def stream_rewriter(
    request: SamplingParams, context: AnswerContext, choices_per_prompt: int | None
) -> StreamRewriter:
    options = request.stream_options
    return StreamRewriter(
        context.route.public_model,
        context.route.tier,
        include_usage=bool(options and options.include_usage),
        continuous_usage=bool(options and options.continuous_usage_stats),
        choices_per_prompt=choices_per_prompt,
        cost=context.cost,
    )


class ChatEndpoint(Endpoint[ChatCompletionRequest]):
    path = upstream_path = "/v1/chat/completions"
    model = ChatCompletionRequest

    def sampling(self, request: ChatCompletionRequest) -> SamplingParams:
        return request

    def writer(self, request: ChatCompletionRequest, context: AnswerContext) -> EventWriter:
        return stream_rewriter(request, context, None)

    def assembler(self, request: ChatCompletionRequest, context: AnswerContext) -> Assembler:
        return ChatAssembler(request.tool_choice)


class CompletionsEndpoint(Endpoint[CompletionRequest]):
    path = upstream_path = "/v1/completions"
    model = CompletionRequest

    def sampling(self, request: CompletionRequest) -> SamplingParams:
        return request

    # A text completion's choice i answers prompt i // n.
    def writer(self, request: CompletionRequest, context: AnswerContext) -> EventWriter:
        return stream_rewriter(request, context, context.n)

    def assembler(self, request: CompletionRequest, context: AnswerContext) -> Assembler:
        return CompletionAssembler(context.n)
