"""The OpenAI request protocol the gateway accepts, as pydantic models (vLLM entrypoints style).

Only the fields modelled here are forwarded: unknown fields are dropped (``extra="ignore"``,
as lenient as OpenAI's SDKs expect), which also keeps vLLM-only knobs that could hurt
other tenants (``priority``, ``chat_template``, ``kv_transfer_params``...) out of clients'
reach. Responses are relayed as vLLM wrote them, with ``model`` and ``service_tier``
rewritten, so they are not modelled.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, TypeVar

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from gateway.errors import GatewayError, bad_request

INT64_MAX = 2**63 - 1
INT64_MIN = -(2**63)

Penalty = Annotated[float, Field(ge=-2.0, le=2.0)]
LogitBias = dict[
    Annotated[str, Field(pattern=r"^\d{1,9}$")], Annotated[float, Field(ge=-100, le=100)]
]
Stop = str | Annotated[list[str], Field(max_length=16)]


class OpenAIModel(BaseModel):
    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)


class StreamOptions(OpenAIModel):
    include_usage: bool | None = None
    continuous_usage_stats: bool | None = None


class FunctionDefinition(OpenAIModel):
    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9_.\-]{1,64}$")]
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(OpenAIModel):
    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(OpenAIModel):
    name: str


class NamedToolChoice(OpenAIModel):
    type: Literal["function"] = "function"
    function: NamedFunction


class FunctionCall(OpenAIModel):
    name: str
    arguments: str


class ToolCall(OpenAIModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class TextPart(OpenAIModel):
    """The models are text-only: other content part types are refused here, not upstream."""

    type: Literal["text"]
    text: str


class ChatMessage(OpenAIModel):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None


class JsonSchemaFormat(OpenAIModel):
    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9_\-]{1,64}$")]
    description: str | None = None
    json_schema: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None

    model_config = ConfigDict(extra="ignore", populate_by_name=True, serialize_by_alias=True)

    @field_validator("json_schema")
    @classmethod
    def _valid_schema(cls, schema: dict[str, Any] | None) -> dict[str, Any] | None:
        """A schema that is not one is the caller's error (vLLM would answer 500)."""
        if schema is not None:
            try:
                Draft202012Validator.check_schema(schema)
            except SchemaError as exc:
                raise ValueError(f"not a valid JSON schema: {exc.message}") from None
            except RecursionError:
                raise ValueError("the JSON schema is nested too deeply") from None
        return schema


class ResponseFormat(OpenAIModel):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class SamplingParams(OpenAIModel):
    """Fields shared by chat and text completions."""

    model: str
    max_tokens: Annotated[int, Field(ge=1, le=INT64_MAX)] | None = None
    temperature: Annotated[float, Field(ge=0.0, le=2.0)] | None = None
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] | None = None
    n: Annotated[int, Field(ge=1, le=INT64_MAX)] | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    stop: Stop | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    logit_bias: LogitBias | None = None
    seed: Annotated[int, Field(ge=INT64_MIN, le=INT64_MAX)] | None = None
    user: str | None = None
    service_tier: str | None = None
    response_format: ResponseFormat | None = None
    # vLLM sampling extensions that RL rollouts rely on.
    top_k: Annotated[int, Field(ge=-1, le=1_000_000)] | None = None
    min_p: Annotated[float, Field(ge=0.0, le=1.0)] | None = None
    repetition_penalty: Annotated[float, Field(gt=0.0, le=10.0)] | None = None
    return_token_ids: bool | None = None
    min_tokens: Annotated[int, Field(ge=0, le=INT64_MAX)] | None = None
    ignore_eos: bool | None = None


class ChatCompletionRequest(SamplingParams):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_completion_tokens: Annotated[int, Field(ge=1, le=INT64_MAX)] | None = None
    logprobs: bool | None = None
    top_logprobs: Annotated[int, Field(ge=0, le=20)] | None = None
    tools: Annotated[list[Tool], Field(max_length=128)] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None


TokenIds = Annotated[list[Annotated[int, Field(ge=0, le=2**31 - 1)]], Field(min_length=1)]


class CompletionRequest(SamplingParams):
    prompt: (
        str
        | Annotated[list[str], Field(min_length=1)]
        | TokenIds
        | Annotated[list[TokenIds], Field(min_length=1)]
    )
    logprobs: Annotated[int, Field(ge=0, le=20)] | None = None
    echo: bool | None = None


RequestT = TypeVar("RequestT", bound=SamplingParams)


def parse_request(model: type[RequestT], body: bytes) -> RequestT:
    """Validate a JSON body; any problem is a 400 that names the offending parameter."""
    try:
        return model.model_validate_json(body)
    except ValidationError as exc:
        raise validation_to_error(exc) from None


def validation_to_error(exc: ValidationError) -> GatewayError:
    first = exc.errors(include_url=False)[0]
    if first["type"] == "json_invalid":
        return bad_request(f"request body is not valid JSON: {first['msg']}", code="invalid_json")
    if first["type"] == "model_type":
        return bad_request("request body must be a JSON object", code="invalid_json")
    param = param_path(first["loc"])
    return bad_request(f"{param}: {first['msg']}", param=param, code="invalid_value")


def param_path(loc: tuple[int | str, ...]) -> str:
    """``('messages', 0, 'content')`` -> ``messages[0].content``, skipping union branch tags."""
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        elif part in _UNION_TAGS or part.startswith(("list[", "dict[", "literal[")):
            continue
        else:
            path += f".{part}" if path else part
    return path


_UNION_TAGS = {"str", "int", "float", "bool", "NamedToolChoice", "TextPart", "[key]"}
