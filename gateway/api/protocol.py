"""The OpenAI request protocol the gateway accepts, as pydantic models (vLLM entrypoints style).

Every top-level field of a chat or text completion request has one written policy, declared
once, on the request models below (``field_policy`` lists them; the README's "Request
fields" section is the same lists, ``tests/gateway/api/test_request_fields.py`` checks that
every parameter of the installed openai SDK has one):

- PASSED: modelled, validated and sent to vLLM (``service_tier`` is the exception: the
  gateway reads it to pick the tier, and vLLM gets that tier's priority instead).
- APPLIED (``applied(...)``): validated and turned by the gateway into what vLLM needs
  (``reasoning_effort`` and ``verbosity`` become chat template kwargs and a thinking
  budget, ``gateway.api.shaping.apply_reasoning``); never sent to vLLM as written.
- IGNORED (``ignored(...)``): accepted and validated, never sent to vLLM. OpenAI platform
  features with no effect on an answer's content (storage, caching hints, end-user ids).
- REFUSED (``refused(...)``): a 400 ``unsupported_parameter`` naming the field when its
  value asks for something this API cannot do (audio, web search, predicted outputs...).
  A value that asks for nothing (null, ``best_of: 1``, ``modalities: ["text"]``) is
  accepted, as OpenAI's SDKs send null for a parameter given as None.

Any other top-level field is a 400 ``unknown_parameter`` naming it, as OpenAI answers
("Unrecognized request argument supplied"): a misspelt parameter fails loudly instead of
being dropped, and vLLM-only knobs that could hurt other tenants (``priority``, ``chat_template``,
``kv_transfer_params``...) never reach vLLM. vLLM's sampling extensions that RL rollouts
use are PASSED. Objects nested in a request (messages, tools...) drop unknown fields
instead: clients send answers' messages back with fields OpenAI added to them (``refusal``,
``annotations``, vLLM's ``reasoning``...), and only the modelled ones are forwarded.

Responses are relayed as vLLM wrote them, with ``model`` and ``service_tier`` rewritten,
so they are not modelled.
"""

from __future__ import annotations

from enum import StrEnum
from functools import cache
from typing import Annotated, Any, Literal, TypeVar

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic.fields import FieldInfo

from gateway.api.grammar_limits import check_patterns
from gateway.errors import GatewayError, bad_request
from serving.vocabulary import ReasoningEffort, Verbosity

INT64_MAX = 2**63 - 1
INT64_MIN = -(2**63)

Penalty = Annotated[float, Field(ge=-2.0, le=2.0)]
LogitBias = dict[
    Annotated[str, Field(pattern=r"^\d{1,9}$")], Annotated[float, Field(ge=-100, le=100)]
]
Stop = str | Annotated[list[str], Field(max_length=16)]


class OpenAIModel(BaseModel):
    """A nested object: unknown fields are dropped (see the module docstring)."""

    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)


class Policy(StrEnum):
    """What the gateway does with a top-level request field (see the module docstring)."""

    PASSED = "passed"
    APPLIED = "applied"
    IGNORED = "ignored"
    REFUSED = "refused"


#: Where ``ignored``/``refused`` mark a field (its JSON schema extras, unused otherwise).
_POLICY_KEY = "x-cstack-policy"


def _marked(policy: Policy, description: str) -> Any:
    """A field of ``policy`` other than PASSED: optional, never dumped into vLLM's body
    (``model_dump``), its policy in its schema extras (``field_policy`` reads it)."""
    return Field(
        default=None,
        exclude=True,
        description=description,
        json_schema_extra={_POLICY_KEY: policy.value},
    )


def ignored(note: str) -> Any:
    """An IGNORED field: validated by its type, never dumped into vLLM's body."""
    return _marked(Policy.IGNORED, note)


def applied(note: str) -> Any:
    """An APPLIED field: validated by its type, translated for vLLM by the gateway."""
    return _marked(Policy.APPLIED, note)


def refused(why: str) -> Any:
    """A REFUSED field: its type admits only values that ask for nothing; any other value
    is a 400 with ``why`` as the reason (``validation_to_error``)."""
    return _marked(Policy.REFUSED, why)


class StreamOptions(OpenAIModel):
    include_usage: bool | None = None
    continuous_usage_stats: bool | None = None


class FunctionDefinition(OpenAIModel):
    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9_.\-]{1,64}$")]
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None

    @field_validator("parameters")
    @classmethod
    def _compilable_patterns(cls, schema: dict[str, Any] | None) -> dict[str, Any] | None:
        # vLLM compiles the parameters into a grammar when the tool must be called.
        if schema is not None:
            check_patterns(schema)
        return schema


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
        return check_json_schema(schema)


def check_json_schema(schema: dict[str, Any] | None) -> dict[str, Any] | None:
    """A schema that is not one, or one whose patterns the engine's grammar compiler
    cannot take, is the caller's error (vLLM would answer 500)."""
    if schema is not None:
        try:
            Draft202012Validator.check_schema(schema)
            check_patterns(schema)
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

    # Top-level fields are strict: see the module docstring.
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

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
    service_tier: str | None = None
    response_format: ResponseFormat | None = None
    # vLLM sampling extensions that RL rollouts rely on.
    top_k: Annotated[int, Field(ge=-1, le=1_000_000)] | None = None
    min_p: Annotated[float, Field(ge=0.0, le=1.0)] | None = None
    repetition_penalty: Annotated[float, Field(gt=0.0, le=10.0)] | None = None
    return_token_ids: bool | None = None
    min_tokens: Annotated[int, Field(ge=0, le=INT64_MAX)] | None = None
    ignore_eos: bool | None = None

    # IGNORED
    user: str | None = ignored("an end-user id OpenAI uses for caching and abuse detection")


Metadata = Annotated[
    dict[Annotated[str, Field(max_length=64)], Annotated[str, Field(max_length=512)]],
    Field(max_length=16),
]


class PromptCacheOptions(OpenAIModel):
    mode: Literal["implicit", "explicit"] | None = None
    ttl: Literal["30m"] | None = None


class PlatformHints(BaseModel):
    """IGNORED fields of chat and responses requests alike: hints to OpenAI's platform
    (abuse detection, its prompt cache) with no effect on an answer here."""

    safety_identifier: Annotated[str, Field(max_length=128)] | None = ignored(
        "an end-user id OpenAI uses for abuse detection"
    )
    prompt_cache_key: str | None = ignored("vLLM's prefix cache needs no hint")
    prompt_cache_retention: Literal["in_memory", "24h"] | None = ignored(
        "vLLM's prefix cache keeps what fits in memory"
    )
    prompt_cache_options: PromptCacheOptions | None = ignored("vLLM's prefix cache needs no hint")


class ChatCompletionRequest(PlatformHints, SamplingParams):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_completion_tokens: Annotated[int, Field(ge=1, le=INT64_MAX)] | None = None
    logprobs: bool | None = None
    top_logprobs: Annotated[int, Field(ge=0, le=20)] | None = None
    tools: Annotated[list[Tool], Field(max_length=128)] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None

    # IGNORED
    store: bool | None = ignored("nothing is stored: there is no stored-completions API")
    metadata: Metadata | None = ignored("tags stored completions at OpenAI; kept nowhere")

    # APPLIED (shaping.apply_reasoning): chat template kwargs and vLLM's thinking budget.
    reasoning_effort: ReasoningEffort | None = applied(
        "thinks up to the variants file's budget for the effort; absent is none"
    )
    verbosity: Verbosity | None = applied(
        "a system line in the chat template: terse (low) or detailed (high) answers"
    )

    # REFUSED
    modalities: list[Literal["text"]] | None = refused(
        'the models answer in text, only ["text"] is accepted'
    )
    audio: None = refused("the models answer in text only")
    prediction: None = refused("vLLM has no predicted outputs")
    web_search_options: None = refused("the models have no web search")
    moderation: None = refused("no moderation model runs here")
    functions: None = refused("deprecated by OpenAI, declare the functions in tools")
    function_call: None = refused("deprecated by OpenAI, use tool_choice")


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

    # REFUSED
    # Sequences sampled but not returned would cost more than admission reserved for n.
    best_of: Literal[1] | None = refused(
        "only 1, the default, is accepted (ask for n choices instead)"
    )
    suffix: None = refused("vLLM has no insertion mode (text after the completion)")


RequestT = TypeVar("RequestT", bound=BaseModel)


def parse_request(model: type[RequestT], body: bytes) -> RequestT:
    """Validate a JSON body; any problem is a 400 that names the offending parameter."""
    try:
        return model.model_validate_json(body)
    except ValidationError as exc:
        raise validation_to_error(exc, model) from None


def field_policy(model: type[BaseModel]) -> dict[str, Policy]:
    """Every top-level field ``model`` accepts, with its policy (see the module docstring)."""
    return {name: _policy(info) for name, info in model.model_fields.items()}


def _policy(info: FieldInfo) -> Policy:
    extra = info.json_schema_extra
    if isinstance(extra, dict) and isinstance(mark := extra.get(_POLICY_KEY), str):
        return Policy(mark)
    return Policy.PASSED


@cache
def _refusals(model: type[BaseModel]) -> dict[str, str]:
    return {
        name: info.description or "not supported"
        for name, info in model.model_fields.items()
        if _policy(info) is Policy.REFUSED
    }


def validation_to_error(exc: ValidationError, model: type[BaseModel] | None = None) -> GatewayError:
    errors = exc.errors(include_url=False)
    refusals = _refusals(model) if model is not None else {}
    # A field no policy admits is named before any other error of the body: it is what a
    # client written for another API (or a legacy one) needs to hear about first.
    first = next(
        (e for e in errors if e["type"] == "extra_forbidden" or _top(e["loc"]) in refusals),
        errors[0],
    )
    if first["type"] == "json_invalid":
        return bad_request(f"request body is not valid JSON: {first['msg']}", code="invalid_json")
    if first["type"] == "model_type" and not first["loc"]:
        return bad_request("request body must be a JSON object", code="invalid_json")
    top = _top(first["loc"])
    if first["type"] == "extra_forbidden":
        # The name as sent (param_path would skip one spelt like a union tag), capped: it
        # is the client's and is echoed back.
        name = (top or param_path(first["loc"]))[:200]
        return bad_request(
            f"Unrecognized request argument supplied: {name}", param=name, code="unknown_parameter"
        )
    if top in refusals:
        return bad_request(
            f"{top} is not supported: {refusals[top]}", param=top, code="unsupported_parameter"
        )
    param = param_path(first["loc"])[:200]  # dict keys in it are the client's: capped
    return bad_request(f"{param}: {first['msg']}", param=param, code="invalid_value")


def _top(loc: tuple[int | str, ...]) -> str | None:
    return loc[0] if loc and isinstance(loc[0], str) else None


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


_UNION_TAGS = {"str", "int", "float", "bool", "NamedToolChoice", "TextPart", "[key]",
               # gateway.api.responses' input items and tool choices
               "input_message", "input_function_call", "input_function_call_output",
               "input_reasoning", "string", "list",
               "FunctionChoice", "InputText"}  # fmt: skip
