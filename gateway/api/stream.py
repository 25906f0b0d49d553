"""vLLM's SSE chunks: their usage tallied for billing, rewritten for the client.

The gateway always asks vLLM for ``continuous_usage_stats`` so that a stream cut short
still has its true token count. The client gets per-chunk usage only if it asked for
``continuous_usage_stats``, ``"usage": null`` per chunk plus the final usage chunk if it
asked for ``include_usage`` (OpenAI's behaviour), and no usage at all otherwise.

Each chunk leaves in OpenAI's published schema (``tests/gateway/openai_response_schema.json``):
``model`` and ``service_tier`` are ours, and the two places where vLLM's chunks break the
schema are mended in place, touching only keys that are there: usage detail objects that
are null, and a chat choice's logprobs without ``refusal``. A chat delta's ``reasoning``
is renamed ``reasoning_content``, this API's name for it. (vLLM's rare in-stream error
is rewritten whole: its ``code`` is a number.)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from gateway.api import json_codec
from serving.vocabulary import ANSWER_SERVICE_TIERS, Tier

DONE_EVENT = b"data: [DONE]\n\n"


def drop_null_usage_details(usage: dict[str, Any]) -> None:
    """vLLM sends ``completion_tokens_details: null`` (and may send a null
    ``prompt_tokens_details``); OpenAI's usage lets a detail object be absent, never null."""
    for key in ("prompt_tokens_details", "completion_tokens_details"):
        if key in usage and usage[key] is None:
            del usage[key]


def mend_choices(choices: list[Any]) -> None:
    """A streamed choice as OpenAI's schema and this API have it:

    - a chat choice's logprobs object must carry ``refusal`` next to ``content``; vLLM
      leaves it out (it never refuses). Text completions' logprobs have no ``content``;
    - vLLM streams a chat delta's reasoning as ``reasoning``; this API's field is
      ``reasoning_content`` (DeepSeek's and Kimi's APIs, which OpenAI SDK users read).
    """
    for choice in choices:
        if not isinstance(choice, dict):
            continue
        logprobs = choice.get("logprobs")
        if logprobs and "content" in logprobs and "refusal" not in logprobs:
            logprobs["refusal"] = None
        delta = choice.get("delta")
        if isinstance(delta, dict) and "reasoning" in delta:
            delta["reasoning_content"] = delta.pop("reasoning")


class UsageTally:
    """A request's usage so far, from vLLM's continuous usage stats.

    vLLM's per-chunk usage covers that chunk's choice only: the prompt tokens of its prompt
    and the completion tokens of that one choice so far. The request's usage is the sum
    over prompts and choices (a text completion's choice ``i`` belongs to prompt ``i // n``;
    a chat has one prompt). The final usage-only chunk, once it arrives, is exact.
    """

    def __init__(self, choices_per_prompt: int | None = None) -> None:
        #: None: every choice answers the same single prompt (chat).
        self._choices_per_prompt = choices_per_prompt
        self._prompt: dict[int, int] = {}
        self._completion: dict[int, int] = {}
        self.final: dict[str, Any] | None = None

    def observe(self, usage: dict[str, Any], choices: object) -> None:
        """A chunk's usage next to its choices as vLLM sent them (dicts)."""
        if not isinstance(choices, list):
            if not choices:
                self.final = usage
            return
        indices = [choice.get("index") if isinstance(choice, dict) else 0 for choice in choices]
        self.observe_indices(usage, indices)

    def observe_indices(self, usage: dict[str, Any], indices: list[object] | None) -> None:
        """A chunk's usage next to the indices of its choices (None or empty: the final
        usage-only chunk)."""
        if not indices:
            self.final = usage
            return
        # A count is a positive int, else 0 (checked inline: this runs for every chunk).
        prompt = usage.get("prompt_tokens")
        if not (isinstance(prompt, int) and prompt > 0):
            prompt = 0
        completion = usage.get("completion_tokens")
        if not (isinstance(completion, int) and completion > 0):
            completion = 0
        per_prompt = self._choices_per_prompt
        for index in indices:
            if not (isinstance(index, int) and index > 0):
                index = 0
            self._prompt[index // per_prompt if per_prompt else 0] = prompt
            self._completion[index] = completion

    @property
    def usage(self) -> dict[str, Any]:
        if self.final is not None:
            return self.final
        if not self._prompt:
            return {}
        prompt, completion = sum(self._prompt.values()), sum(self._completion.values())
        return {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        }


#: Characters JSON keeps raw inside strings but that line readers other than SSE's break
#: lines at: Python's ``str.splitlines`` (httpx's ``aiter_lines``, so a client reading a
#: stream with it got half an event when a token decoded to one) and JavaScript before
#: ES2019. Their UTF-8 bytes occur nowhere else, so they are escaped byte for byte.
_LINE_BREAKS_JSON_KEEPS = (
    (b"\xe2\x80\xa8", b"\\u2028"),
    (b"\xe2\x80\xa9", b"\\u2029"),
    (b"\xc2\x85", b"\\u0085"),
)


def event_json(value: object) -> bytes:
    """``value`` as the JSON of one ``data:`` line: one line to any line reader."""
    data = json_codec.dumps(value)
    if not data.isascii():  # each of them starts with a byte past ASCII
        for raw, escaped in _LINE_BREAKS_JSON_KEEPS:
            if raw in data:
                data = data.replace(raw, escaped)
    return data


def split_events(buffer: bytes) -> tuple[list[bytes], bytes]:
    """Complete SSE events in ``buffer`` (without their blank line), and the rest."""
    events = buffer.split(b"\n\n")
    return events[:-1], events[-1]


def event_payload(event: bytes) -> bytes | None:
    """The data of a ``data:`` event; None for comments and keep-alives."""
    event = event.strip(b"\r\n ")
    if not event.startswith(b"data:"):
        return None
    return event[5:].strip()


#: The request's cost from its usage (``gateway.api.relay.Relay.usage_cost``), or None.
UsageCost = Callable[[dict[str, Any]], dict[str, Any] | None]
#: The extension field of an answer's final ``usage`` that carries it (OpenAI's usage
#: object is open to extra fields, and the openai SDK keeps them: ``usage.cstack_cost``).
COST_FIELD = "cstack_cost"


def add_cost(usage: object, cost: UsageCost | None) -> None:
    """The final usage of an answer with the request's cost in ``COST_FIELD``."""
    if cost is not None and isinstance(usage, dict) and usage:
        priced = cost(usage)
        if priced is not None:
            usage[COST_FIELD] = priced


class EventWriter(Protocol):
    """What the relay needs of a stream's writer: ``StreamRewriter`` for chat and text
    completions, ``gateway.api.responses.events.ResponseEventWriter`` for responses."""

    #: The upstream stream ended with ``[DONE]``.
    done: bool
    #: vLLM sent an error event in the stream.
    failed: bool

    @property
    def usage(self) -> dict[str, Any]:
        """The usage so far, in chat's shape: what billing settles on."""
        ...

    def feed(self, raw: bytes) -> list[bytes]:
        """Split raw upstream bytes into events; return the events to send on."""
        ...

    def error_event(self, message: str, code: str) -> bytes:
        """The event that ends a stream the gateway cuts (``code``: why)."""
        ...


class StreamRewriter:
    def __init__(
        self,
        public_model: str,
        tier: Tier,
        include_usage: bool,
        continuous_usage: bool,
        choices_per_prompt: int | None = None,
        cost: UsageCost | None = None,
    ) -> None:
        self.public_model = public_model
        #: The request's cost from its final usage, for the final usage chunk.
        self.cost = cost
        self.service_tier = ANSWER_SERVICE_TIERS[tier]
        self.include_usage = include_usage
        self.continuous_usage = continuous_usage
        #: What billing settles on.
        self.tally = UsageTally(choices_per_prompt)
        self.done = False
        #: vLLM sent an error event in the stream (e.g. it was shut down).
        self.failed = False
        self._buffer = b""

    @property
    def usage(self) -> dict[str, Any]:
        return self.tally.usage

    def feed(self, raw: bytes) -> list[bytes]:
        """Split raw upstream bytes into events; return the events to send on."""
        events, self._buffer = split_events(self._buffer + raw)
        out: list[bytes] = []
        for event in events:
            rewritten = self.rewrite(event)
            if rewritten is not None:
                out.append(rewritten)
        return out

    def error_event(self, message: str, code: str) -> bytes:
        return error_event(message, code)

    def rewrite(self, event: bytes) -> bytes | None:
        payload = event_payload(event)
        if payload is None:
            return None  # comments / keep-alives: nothing the client needs
        if payload == b"[DONE]":
            self.done = True
            return DONE_EVENT
        try:
            data = json_codec.loads(payload)
        except ValueError:
            return None
        if not isinstance(data, dict):
            return None
        if "error" in data:
            self.failed = True
            return upstream_error_event(data["error"])
        choices = data.get("choices")
        usage = data.get("usage")
        if isinstance(usage, dict):
            if usage:
                self.tally.observe(usage, choices)
            drop_null_usage_details(usage)
        if not choices and usage is not None:
            # vLLM's final usage-only chunk.
            if not self.include_usage:
                return None
            add_cost(usage, self.cost)
        elif not self.continuous_usage:
            if self.include_usage:
                data["usage"] = None
            else:
                data.pop("usage", None)
        if choices and isinstance(choices, list):
            mend_choices(choices)
        data["model"] = self.public_model
        data["service_tier"] = self.service_tier
        return b"data: " + event_json(data) + b"\n\n"


def upstream_error_event(error: object) -> bytes:
    """vLLM's in-stream error in OpenAI's error shape: vLLM's ``code`` is the HTTP status
    as a number, OpenAI's a string (or null)."""
    detail = error if isinstance(error, dict) else {"message": str(error)}
    code, param = detail.get("code"), detail.get("param")
    body = {
        "error": {
            "message": str(detail.get("message") or "upstream error"),
            "type": str(detail.get("type") or "server_error"),
            "param": param if isinstance(param, str) else None,
            "code": None if code is None else str(code),
        }
    }
    return b"data: " + event_json(body) + b"\n\n"


def error_event(message: str, code: str) -> bytes:
    """An in-stream error in the shape the openai SDK raises ``APIError`` for."""
    body = {"error": {"message": message, "type": "server_error", "param": None, "code": code}}
    return b"data: " + event_json(body) + b"\n\n"
