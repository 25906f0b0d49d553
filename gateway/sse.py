"""vLLM's SSE chunks: their usage tallied for billing, rewritten for the client.

The gateway always asks vLLM for ``continuous_usage_stats`` so that a stream cut short
still has its true token count. The client gets per-chunk usage only if it asked for
``continuous_usage_stats``, ``"usage": null`` per chunk plus the final usage chunk if it
asked for ``include_usage`` (OpenAI's behaviour), and no usage at all otherwise.
"""

from __future__ import annotations

from typing import Any

import pydantic_core

DONE_EVENT = b"data: [DONE]\n\n"


def _count(value: object) -> int:
    return value if isinstance(value, int) and value > 0 else 0


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
        if not choices:
            self.final = usage
            return
        if not isinstance(choices, list):
            return
        prompt, completion = _count(usage.get("prompt_tokens")), usage.get("completion_tokens")
        for choice in choices:
            index = _count(choice.get("index")) if isinstance(choice, dict) else 0
            per_prompt = self._choices_per_prompt
            self._prompt[index // per_prompt if per_prompt else 0] = prompt
            self._completion[index] = _count(completion)

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


class StreamRewriter:
    def __init__(
        self,
        public_model: str,
        tier: str,
        include_usage: bool,
        continuous_usage: bool,
        choices_per_prompt: int | None = None,
    ) -> None:
        self.public_model = public_model
        self.tier = tier
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

    def rewrite(self, event: bytes) -> bytes | None:
        payload = event_payload(event)
        if payload is None:
            return None  # comments / keep-alives: nothing the client needs
        if payload == b"[DONE]":
            self.done = True
            return DONE_EVENT
        try:
            data = pydantic_core.from_json(payload)
        except ValueError:
            return None
        if not isinstance(data, dict):
            return None
        if "error" in data:
            self.failed = True
            return b"data: " + payload + b"\n\n"
        usage = data.get("usage")
        if usage and isinstance(usage, dict):
            self.tally.observe(usage, data.get("choices"))
        if not data.get("choices") and usage is not None:
            # vLLM's final usage-only chunk.
            if not self.include_usage:
                return None
        elif not self.continuous_usage:
            if self.include_usage:
                data["usage"] = None
            else:
                data.pop("usage", None)
        data["model"] = self.public_model
        data["service_tier"] = self.tier
        return b"data: " + pydantic_core.to_json(data) + b"\n\n"


def error_event(message: str, code: str) -> bytes:
    """An in-stream error in the shape the openai SDK raises ``APIError`` for."""
    body = {"error": {"message": message, "type": "server_error", "param": None, "code": code}}
    return b"data: " + pydantic_core.to_json(body) + b"\n\n"
