"""What a generation request may cost at most, and the body vLLM is sent for it.

Admission reserves the request's worst case, which must be an upper bound (billing's
promise that no org ends a period more than one request's worst case over its limit rests
on it); ``settle`` then bills vLLM's exact count and releases the rest.

- Prompt tokens, over every prompt of the request, are bounded by the body's length in
  bytes, without running a tokenizer on the hot path: every byte-level BPE token covers
  at least one byte of text, a token id takes at least two bytes of JSON (digit and
  comma), and the JSON around each message is longer than the chat template's tokens for
  it. A request translated to a chat (the Responses API: a bare string ``input`` or a
  short input item is less JSON than the chat message it becomes) is bounded by the
  larger of its own body and the chat body vLLM gets. Tools are the exception: the
  template adds a preamble once (``TOOLS_TEMPLATE_TOKENS``), and vLLM renders every tool
  with the fields the client left out as nulls (``"description": null, "parameters":
  null``), allowed for by ``TOOL_DEFAULTS_TOKENS`` a tool.
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

from dataclasses import dataclass
from typing import Any

import pydantic_core

from gateway.api import json_codec
from gateway.api.protocol import (
    ChatCompletionRequest,
    ChatMessage,
    CompletionRequest,
    SamplingParams,
)
from gateway.errors import bad_request
from gateway.settings import GatewaySettings
from gateway.upstream.routing import PrefixKey, chat_key, text_key
from gateway.upstream.tiers import TierRoute

UPSTREAM_STREAM_OPTIONS = {"include_usage": True, "continuous_usage_stats": True}
#: Tokens allowed for what a chat template adds once when a request declares tools (the
#: tiny checkpoint's Hermes-style preamble is about 110; 512 leaves room for longer ones).
TOOLS_TEMPLATE_TOKENS = 512
#: Tokens allowed a tool for the fields vLLM renders as nulls when the client left them
#: out (``, "description": null, "parameters": null, "strict": null`` is 55 bytes).
TOOL_DEFAULTS_TOKENS = 64
#: Output tokens per chunk vLLM streams for a request the client asked to answer whole
#: (vLLM's ``stream_interval``; its first and last chunks come at once). The gateway reads
#: the stream only to assemble the answer and to know the tokens generated if the request
#: is cut short; a chunk per token cost vLLM's API server, a Python process that every
#: request on the engine goes through, and the gateway's parser a step each: on the tiny
#: CPU engine, 8 clients of 128-token answers got 1.07-1.17x the tokens/s with 16. What a
#: cut request goes unbilled for grows to the tokens after its last chunk: at most 15 a
#: choice, of an answer its client never received.
UNSTREAMED_STREAM_INTERVAL = 16
#: A chat request without ``reasoning_effort`` does not think, as GPT-5.1 defaults to
#: ``none``: clients written before reasoning keep their answers, latency and bills.
DEFAULT_REASONING_EFFORT = "none"


@dataclass(slots=True)
class Shape:
    """What a request may cost at most, and what vLLM is asked for. Read-only once made
    (not ``frozen``: a frozen dataclass costs 4x to make, on every request's path)."""

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


def shape_request(
    parsed: SamplingParams,
    route: TierRoute,
    body_bytes: int,
    settings: GatewaySettings,
    context: int | None,
) -> Shape:
    """The body vLLM gets, and the most the request may cost (for admission); ``context``
    is the tier's engines' context length, where known."""
    prompts = 1
    template_tokens = 0  # what the chat template adds beyond the body's JSON
    body: dict[str, Any] = parsed.model_dump(exclude_unset=True, exclude_none=True)
    body.pop("service_tier", None)
    body["model"] = route.served_model
    if route.priority is not None:
        body["priority"] = route.priority
    if not body.get("stream"):
        # Nobody reads its tokens as they come: see UNSTREAMED_STREAM_INTERVAL.
        body["stream_interval"] = max(route.stream_interval or 1, UNSTREAMED_STREAM_INTERVAL)
    elif route.stream_interval:
        body["stream_interval"] = route.stream_interval
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
            template_tokens += TOOLS_TEMPLATE_TOKENS + TOOL_DEFAULTS_TOKENS * len(parsed.tools)
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
    cap = route.max_tokens if context is None else min(route.max_tokens, context)
    body["max_tokens"] = requested or cap
    n = parsed.n or 1
    if n > settings.max_n:
        raise bad_request(f"n: at most {settings.max_n} choices per request", param="n")
    if not parsed.stream and parsed.stream_options is not None:
        raise bad_request(
            "stream_options: only allowed when stream is true", param="stream_options"
        )
    # Streamed from vLLM in every case: see gateway.api.handler's docstring.
    body["stream"] = True
    body["stream_options"] = UPSTREAM_STREAM_OPTIONS
    per_sequence = body["max_tokens"] if context is None else min(body["max_tokens"], context)
    upstream_body = json_codec.dumps(body)
    # An upper bound: see the module docstring.
    prompt_tokens = max(body_bytes, len(upstream_body)) + template_tokens
    return Shape(
        upstream_body=upstream_body,
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
