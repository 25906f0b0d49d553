"""``POST /v1/responses`` as an endpoint object: served as the chat completion it
translates to, its answers written as Responses (events streamed, or one Response)."""

from __future__ import annotations

from gateway.api.answers import Assembler
from gateway.api.endpoints import AnswerContext, Endpoint
from gateway.api.protocol import SamplingParams
from gateway.api.responses.events import ResponseEventWriter
from gateway.api.responses.output import ResponseAssembler
from gateway.api.responses.protocol import ResponsesRequest, as_responses_error
from gateway.api.stream import EventWriter
from gateway.errors import GatewayError


class ResponsesEndpoint(Endpoint[ResponsesRequest]):
    path = "/v1/responses"
    upstream_path = "/v1/chat/completions"
    model = ResponsesRequest

    def sampling(self, request: ResponsesRequest) -> SamplingParams:
        return request.to_chat()

    def writer(self, request: ResponsesRequest, context: AnswerContext) -> EventWriter:
        route = context.route
        return ResponseEventWriter(
            request,
            context.request_id,
            context.created,
            route.public_model,
            route.tier,
            cost=context.cost,
        )

    def assembler(self, request: ResponsesRequest, context: AnswerContext) -> Assembler:
        return ResponseAssembler(request, context.request_id, context.created)

    def client_error(self, exc: GatewayError) -> GatewayError:
        return as_responses_error(exc)
