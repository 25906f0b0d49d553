"""Rewriting vLLM's SSE chunks for the client: public model id, tier served, usage as asked.

The gateway always asks vLLM for ``continuous_usage_stats`` so that a stream cut short
still has its true token count. The client gets per-chunk usage only if it asked for
``continuous_usage_stats``, ``"usage": null`` per chunk plus the final usage chunk if it
asked for ``include_usage`` (OpenAI's behaviour), and no usage at all otherwise.
"""

from __future__ import annotations

from typing import Any

import pydantic_core

DONE_EVENT = b"data: [DONE]\n\n"


class StreamRewriter:
    def __init__(
        self, public_model: str, tier: str, include_usage: bool, continuous_usage: bool
    ) -> None:
        self.public_model = public_model
        self.tier = tier
        self.include_usage = include_usage
        self.continuous_usage = continuous_usage
        #: The latest usage vLLM reported (cumulative), what billing settles on.
        self.usage: dict[str, Any] = {}
        self.done = False
        #: vLLM sent an error event in the stream (e.g. it was shut down).
        self.failed = False
        self._buffer = b""

    def feed(self, raw: bytes) -> list[bytes]:
        """Split raw upstream bytes into events; return the events to send on."""
        self._buffer += raw
        out: list[bytes] = []
        while True:
            end = self._buffer.find(b"\n\n")
            if end < 0:
                return out
            event = self._buffer[:end]
            self._buffer = self._buffer[end + 2 :]
            rewritten = self.rewrite(event)
            if rewritten is not None:
                out.append(rewritten)

    def rewrite(self, event: bytes) -> bytes | None:
        event = event.strip(b"\r\n ")
        if not event.startswith(b"data:"):
            return None  # comments / keep-alives: nothing the client needs
        payload = event[5:].strip()
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
        if usage:
            self.usage = usage
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
