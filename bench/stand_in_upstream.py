"""The fast upstream `bench/gateway_overhead.py` puts every gateway in front of: a raw asyncio
HTTP server answering canned chat completions (8 tokens) and SSE streams (8 events and
`[DONE]`) to any request, in its own process, so that what the benchmark measures is the
gateways and not an engine.

    python bench/stand_in_upstream.py PORT      # prints "ready" once it listens

``POST /bench/delay`` with a body of milliseconds sets how long it waits before answering
(``set_upstream_delay``, the benchmark's control).
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import cast

STREAM_EVENTS = 8


def canned_responses() -> tuple[bytes, bytes]:
    usage = {
        "prompt_tokens": 9,
        "completion_tokens": STREAM_EVENTS,
        "total_tokens": 9 + STREAM_EVENTS,
    }
    completion = {
        "id": "chatcmpl-bench", "object": "chat.completion", "created": 1, "model": "composer-2.5",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "hello " * 8},
                     "finish_reason": "length"}],
        "usage": usage,
    }  # fmt: skip
    body = json.dumps(completion, separators=(",", ":")).encode()
    plain = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (
        len(body),
        body,
    )
    stream = (
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
    )
    for index in range(STREAM_EVENTS):
        chunk = {
            "id": "chatcmpl-bench", "object": "chat.completion.chunk", "created": 1,
            "model": "composer-2.5",
            "choices": [{"index": 0, "delta": {"content": "hello "}, "finish_reason": None}],
            "usage": {"prompt_tokens": 9, "completion_tokens": index + 1,
                      "total_tokens": 10 + index},
        }  # fmt: skip
        event = b"data: " + json.dumps(chunk, separators=(",", ":")).encode() + b"\n\n"
        stream += b"%x\r\n%s\r\n" % (len(event), event)
    done = b"data: [DONE]\n\n"
    stream += b"%x\r\n%s\r\n0\r\n\r\n" % (len(done), done)
    return plain, stream


class UpstreamProtocol(asyncio.Protocol):
    """Answers after ``delay_s`` (a stand-in for generation time); streams arrive in two
    bursts, half the events at ``delay_s / 2``, so relaying is interleaved with waiting.
    ``POST /bench/delay`` with a body of milliseconds sets ``delay_s`` (the benchmark's
    control, sent straight to it)."""

    PLAIN, STREAM = canned_responses()
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
                half = len(self.STREAM) // 2
                if self.delay_s:
                    self.loop.call_later(self.delay_s / 2, self.write, self.STREAM[:half])
                    self.loop.call_later(self.delay_s, self.write, self.STREAM[half:])
                else:
                    self.write(self.STREAM)
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
