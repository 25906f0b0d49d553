"""The fast upstream `bench/gateway_overhead.py` puts every gateway in front of: a raw asyncio
HTTP server answering canned chat completions of 8 tokens to any request, in its own
process, so that what the benchmark measures is the gateways and not an engine.

    python bench/stand_in_upstream.py PORT      # prints "ready" once it listens

A stream has the events vLLM 0.32 sends for the body it gets (``stream_events``): the
role's chunk, the tokens a chunk each or ``stream_interval`` at a time (the first alone,
the rest with the finish), usage in each chunk when ``continuous_usage_stats`` is asked
for and a chunk of its own when ``include_usage`` is, then ``[DONE]``. One choice,
whatever ``n`` asks: TensorZero refuses ``n > 1``, and every gateway relays the same work.

``POST /bench/delay`` with a body of milliseconds sets how long it waits before answering
(``set_upstream_delay``, the benchmark's control).
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
from functools import cache
from typing import Any, cast

ANSWER_TOKENS = 8
PROMPT_TOKENS = 9
_INTERVAL = re.compile(rb'"stream_interval": ?(\d+)')
_STREAM_HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
)


def plain_response() -> bytes:
    usage = {
        "prompt_tokens": PROMPT_TOKENS,
        "completion_tokens": ANSWER_TOKENS,
        "total_tokens": PROMPT_TOKENS + ANSWER_TOKENS,
    }
    completion = {
        "id": "chatcmpl-bench", "object": "chat.completion", "created": 1, "model": "composer-2.5",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "hello " * 8},
                     "finish_reason": "length"}],
        "usage": usage,
    }  # fmt: skip
    body = json.dumps(completion, separators=(",", ":")).encode()
    return b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (
        len(body),
        body,
    )


def stream_events(interval: int, include_usage: bool, continuous: bool) -> list[dict[str, Any]]:
    """The chunks vLLM sends for an answer of ANSWER_TOKENS tokens: it sends the first
    token at once, then whenever ``interval`` more are made, or the answer ends."""

    def usage(completion: int) -> dict[str, int]:
        return {
            "prompt_tokens": PROMPT_TOKENS,
            "total_tokens": PROMPT_TOKENS + completion,
            "completion_tokens": completion,
        }

    def chunk(choices: list[dict[str, Any]], made: int) -> dict[str, Any]:
        event: dict[str, Any] = {
            "id": "chatcmpl-bench", "object": "chat.completion.chunk", "created": 1,
            "model": "composer-2.5", "choices": choices,
        }  # fmt: skip
        if continuous:
            event["usage"] = usage(made)
        return event

    role = {"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}
    events = [chunk([role], 0)]
    sent = 0
    for made in range(1, ANSWER_TOKENS + 1):
        last = made == ANSWER_TOKENS
        if sent and made - sent < interval and not last:
            continue
        delta = {"content": "hello " * (made - sent)}
        finish = "length" if last else None
        events.append(chunk([{"index": 0, "delta": delta, "finish_reason": finish}], made))
        sent = made
    if include_usage:
        events.append({**chunk([], ANSWER_TOKENS), "usage": usage(ANSWER_TOKENS)})
    return events


@cache
def stream_response(interval: int, include_usage: bool, continuous: bool) -> bytes:
    """The whole chunked HTTP response of ``stream_events``."""
    response = _STREAM_HEAD
    for chunk in stream_events(interval, include_usage, continuous):
        event = b"data: " + json.dumps(chunk, separators=(",", ":")).encode() + b"\n\n"
        response += b"%x\r\n%s\r\n" % (len(event), event)
    done = b"data: [DONE]\n\n"
    return response + b"%x\r\n%s\r\n0\r\n\r\n" % (len(done), done)


def stream_for(body: bytes) -> bytes:
    """The stream vLLM would send for this request body (found without parsing it: the
    upstream shares a CPU with the load it answers)."""
    interval = _INTERVAL.search(body)
    return stream_response(
        int(interval[1]) if interval else 1,
        b'"include_usage":true' in body or b'"include_usage": true' in body,
        b'"continuous_usage_stats":true' in body or b'"continuous_usage_stats": true' in body,
    )


class UpstreamProtocol(asyncio.Protocol):
    """Answers after ``delay_s`` (a stand-in for generation time); streams arrive in two
    bursts, half the events at ``delay_s / 2``, so relaying is interleaved with waiting.
    ``POST /bench/delay`` with a body of milliseconds sets ``delay_s`` (the benchmark's
    control, sent straight to it)."""

    PLAIN = plain_response()
    HEALTH = b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n"
    delay_s = 0.0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self.buffer = b""
        self.loop = asyncio.get_running_loop()

    def write(self, data: bytes) -> None:
        if not self.transport.is_closing():
            self.transport.write(data)

    def answer(self, data: bytes) -> None:
        if self.delay_s:
            self.loop.call_later(self.delay_s, self.write, data)
        else:
            self.write(data)

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while (head_end := self.buffer.find(b"\r\n\r\n")) >= 0:
            head = self.buffer[:head_end].lower()
            length = 0
            if (at := head.find(b"content-length:")) >= 0:
                end = head.find(b"\r\n", at)
                length = int(head[at + 15 : end if end >= 0 else None])
            if len(self.buffer) < head_end + 4 + length:
                return
            body = self.buffer[head_end + 4 : head_end + 4 + length]
            self.buffer = self.buffer[head_end + 4 + length :]
            if head.startswith(b"get /health"):
                self.write(self.HEALTH)
            elif head.startswith(b"post /bench/delay"):
                UpstreamProtocol.delay_s = float(body) / 1000
                self.write(self.HEALTH)
            # The gateway writes compact JSON, the openai SDK (LiteLLM) JSON with spaces.
            elif b'"stream":true' in body or b'"stream": true' in body:
                stream = stream_for(body)
                half = len(stream) // 2
                if self.delay_s:
                    self.loop.call_later(self.delay_s / 2, self.write, stream[:half])
                    self.loop.call_later(self.delay_s, self.write, stream[half:])
                else:
                    self.write(stream)
            else:
                self.answer(self.PLAIN)


async def serve_upstream(port: int) -> None:
    server = await asyncio.get_running_loop().create_server(UpstreamProtocol, "127.0.0.1", port)
    print("ready", flush=True)
    await server.serve_forever()


async def set_upstream_delay(upstream_port: int, delay_ms: float) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", upstream_port)
    payload = str(delay_ms).encode()
    writer.write(
        b"POST /bench/delay HTTP/1.1\r\nhost: x\r\ncontent-length: %d\r\n\r\n%s"
        % (len(payload), payload)
    )
    await reader.readuntil(b"\r\n\r\n")
    writer.close()


def main(port: int) -> None:
    try:
        import uvloop

        uvloop.run(serve_upstream(port))
    except ImportError:
        asyncio.run(serve_upstream(port))


if __name__ == "__main__":
    main(int(sys.argv[1]))
