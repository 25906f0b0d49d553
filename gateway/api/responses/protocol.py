"""The ``POST /v1/responses`` request: validated with a written field policy (as chat's in
gateway.api.protocol: passed, ignored or refused, any other top-level field a 400 naming it),
and translated into the chat completion request it means (``ResponsesRequest.to_chat``)."""

from __future__ import annotations

from typing import Annotated, Any, Literal, TypeVar

from pydantic import (
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    ValidationError,
    model_validator,
)
from pydantic_core import PydanticCustomError

from gateway.api.protocol import (
    INT64_MAX,
    ChatCompletionRequest,
    FunctionDefinition,
    JsonSchemaFormat,
    Metadata,
    OpenAIModel,
    PlatformHints,
    ignored,
    refused,
)
from gateway.errors import GatewayError, bad_request
from serving.vocabulary import ReasoningEffort, Verbosity

#: Chat parameters the shared request checks may name, as a responses client knows them.
RESPONSES_PARAMS = {"max_completion_tokens": "max_output_tokens", "messages": "input"}
NOT_STORED = "nothing is stored here: send the whole conversation in input"
T = TypeVar("T")


def _string_or_list(value: Any) -> str:
    return "string" if isinstance(value, str) else "list"


#: A string or a list of ``T``: a 400 then names what is wrong in the form that was sent,
#: instead of first saying that the list is not a string.
StringOr = Annotated[
    Annotated[str, Tag("string")] | Annotated[T, Tag("list")], Discriminator(_string_or_list)
]


class InputText(OpenAIModel):
    """The models read text only: image, file and audio parts are refused here."""

    type: Literal["input_text", "output_text"]
    text: str


class MessageItem(OpenAIModel):
    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: StringOr[list[InputText]]


class FunctionCallItem(OpenAIModel):
    type: Literal["function_call"]
    call_id: Annotated[str, Field(min_length=1, max_length=256)]
    name: str
    arguments: str


class FunctionCallOutputItem(OpenAIModel):
    type: Literal["function_call_output"]
    call_id: Annotated[str, Field(min_length=1, max_length=256)]
    output: StringOr[list[InputText]]


class ReasoningItem(OpenAIModel):
    """An earlier turn's reasoning, sent back as OpenAI asks clients to: dropped."""

    type: Literal["reasoning"]


def _item_tag(item: Any) -> str | None:
    """An input item's union tag: ``input_`` and its type (a message may leave it out).
    The tags are not the types, which would read as field names in a 400's param."""
    kind = item.get("type", "message") if isinstance(item, dict) else getattr(item, "type", None)
    return f"input_{kind}" if isinstance(kind, str) else None


InputItem = Annotated[
    Annotated[MessageItem, Tag("input_message")]
    | Annotated[FunctionCallItem, Tag("input_function_call")]
    | Annotated[FunctionCallOutputItem, Tag("input_function_call_output")]
    | Annotated[ReasoningItem, Tag("input_reasoning")],
    Discriminator(_item_tag),
]


class FunctionTool(FunctionDefinition):
    """Chat's function definition with its ``type`` beside it. The models call functions
    only: web search, file search, MCP and the other hosted tools are a 400 naming it."""

    type: Literal["function"]

    @model_validator(mode="before")
    @classmethod
    def _function_only(cls, data: Any) -> Any:
        kind = data.get("type") if isinstance(data, dict) else None
        if isinstance(kind, str) and kind != "function":
            raise PydanticCustomError(
                "unsupported_tool",
                "{kind} tools are not supported: the models call only function tools",
                {"kind": kind[:64]},
            )
        return data


class FunctionChoice(OpenAIModel):
    type: Literal["function"]
    name: str


class Reasoning(OpenAIModel):
    effort: ReasoningEffort | None = None
    # Accepted and ignored: reasoning comes back as its text, never summarised.
    summary: Literal["auto", "concise", "detailed"] | None = None
    generate_summary: Literal["auto", "concise", "detailed"] | None = None


class TextFormat(JsonSchemaFormat):
    """``text.format``: chat's json_schema fields flat beside the format's type (``name``
    is required for a json_schema format only)."""

    type: Literal["text", "json_object", "json_schema"]
    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9_\-]{1,64}$")] | None = None  # type: ignore[assignment]

    @model_validator(mode="after")
    def _named_schema(self) -> TextFormat:
        if self.type == "json_schema" and self.name is None:
            raise PydanticCustomError("missing", "name: required for a json_schema format")
        return self


class TextConfig(OpenAIModel):
    format: TextFormat | None = None
    verbosity: Verbosity | None = None


class ResponsesRequest(PlatformHints):
    """A ``POST /v1/responses`` body; top-level fields are strict, as in gateway.api.protocol."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    model: str
    input: StringOr[Annotated[list[InputItem], Field(min_length=1)]]
    instructions: str | None = None
    max_output_tokens: Annotated[int, Field(ge=1, le=INT64_MAX)] | None = None
    temperature: Annotated[float, Field(ge=0.0, le=2.0)] | None = None
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] | None = None
    stream: bool | None = None
    tools: Annotated[list[FunctionTool], Field(max_length=128)] | None = None
    tool_choice: Literal["none", "auto", "required"] | FunctionChoice | None = None
    parallel_tool_calls: bool | None = None
    service_tier: str | None = None
    reasoning: Reasoning | None = None
    text: TextConfig | None = None
    # Echoed in the response, as OpenAI does; kept nowhere.
    metadata: Metadata | None = None

    # IGNORED
    user: str | None = ignored("an end-user id OpenAI uses for caching and abuse detection")
    include: Annotated[list[str], Field(max_length=32)] | None = ignored(
        "reasoning text is always in reasoning items; nothing is encrypted"
    )
    stream_options: dict[str, Any] | None = ignored("events are never obfuscated")
    max_tool_calls: Annotated[int, Field(ge=1)] | None = ignored(
        "limits hosted tools' calls; the models call only the client's functions"
    )

    # REFUSED
    store: Literal[False] | None = refused(NOT_STORED + " with store: false")
    previous_response_id: None = refused(NOT_STORED)
    conversation: None = refused(NOT_STORED)
    context_management: None = refused("no server-side compaction: nothing is stored here")
    background: Literal[False] | None = refused("responses run in the foreground only")
    background_options: None = refused("responses run in the foreground only")
    prompt: None = refused("no stored prompt templates: send instructions and input")
    truncation: Literal["disabled"] | None = refused(
        'the gateway never drops input: only "disabled" is accepted'
    )
    top_logprobs: None = refused("log probabilities are not returned by this API here")
    moderation: None = refused("no moderation model runs here")
    image: None = refused("the models answer in text only")
    access_programs: None = refused("no access programs here")

    def to_chat(self) -> ChatCompletionRequest:
        """The chat completion request this response asks for (see the module docstring)."""
        chat: dict[str, Any] = {"model": self.model, "messages": self._messages()}
        for name in ("temperature", "top_p", "stream", "parallel_tool_calls", "service_tier"):
            value = getattr(self, name)
            if value is not None:
                chat[name] = value
        if self.max_output_tokens is not None:
            chat["max_completion_tokens"] = self.max_output_tokens
        if self.tools:
            chat["tools"] = [
                {"type": "function", "function": tool.model_dump(exclude={"type"}, by_alias=True)}
                for tool in self.tools
            ]
        if isinstance(self.tool_choice, FunctionChoice):
            chat["tool_choice"] = {"type": "function", "function": {"name": self.tool_choice.name}}
        elif self.tool_choice is not None:
            chat["tool_choice"] = self.tool_choice
        if self.reasoning is not None and self.reasoning.effort is not None:
            chat["reasoning_effort"] = self.reasoning.effort
        if self.text is not None:
            if self.text.verbosity is not None:
                chat["verbosity"] = self.text.verbosity
            if self.text.format is not None:
                chat["response_format"] = response_format(self.text.format)
        # Prefix routing keys a conversation by its client's name for it.
        if (session := self.prompt_cache_key or self.safety_identifier or self.user) is not None:
            chat["user"] = session
        try:
            return ChatCompletionRequest.model_validate(chat)
        except ValidationError as exc:
            first = exc.errors(include_url=False)[0]
            raise bad_request(f"input: {first['msg']}", param="input") from None

    def _messages(self) -> list[dict[str, Any]]:
        messages: list[dict[str, Any]] = []
        if self.instructions:
            messages.append({"role": "system", "content": self.instructions})
        items = (
            [MessageItem(role="user", content=self.input)]
            if isinstance(self.input, str)
            else self.input
        )
        for item in items:
            if isinstance(item, MessageItem):
                messages.append({"role": item.role, "content": text_of(item.content)})
            elif isinstance(item, FunctionCallItem):
                call = {
                    "id": item.call_id,
                    "type": "function",
                    "function": {"name": item.name, "arguments": item.arguments},
                }
                last = messages[-1] if messages else None
                # A turn's calls follow its text: one assistant message in chat's terms.
                if last is not None and last["role"] == "assistant":
                    last.setdefault("tool_calls", []).append(call)
                else:
                    messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
            elif isinstance(item, FunctionCallOutputItem):
                messages.append(
                    {"role": "tool", "tool_call_id": item.call_id, "content": text_of(item.output)}
                )
        if not any(message["role"] != "system" for message in messages):
            raise bad_request("input: no message or tool output to answer", param="input")
        return messages


def text_of(content: str | list[InputText]) -> str:
    return content if isinstance(content, str) else "".join(part.text for part in content)


def response_format(text_format: TextFormat) -> dict[str, Any]:
    if text_format.type != "json_schema":
        return {"type": text_format.type}
    fields = {"name", "description", "json_schema", "strict"}
    schema = text_format.model_dump(include=fields, exclude_none=True, by_alias=True)
    return {"type": "json_schema", "json_schema": schema}


def as_responses_error(exc: GatewayError) -> GatewayError:
    """A 400 from the chat checks, naming the parameter as a responses client sent it."""
    if exc.param in RESPONSES_PARAMS:
        name = RESPONSES_PARAMS[exc.param]
        exc.message = exc.message.replace(exc.param, name, 1)
        exc.param = name
    return exc
