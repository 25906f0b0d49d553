"""A streamed event is one line to any line reader: tokens that decode to characters JSON
keeps raw but ``str.splitlines`` (httpx's ``aiter_lines``) breaks at come out escaped."""

from __future__ import annotations

import json

import httpx
import pytest

from gateway.api.stream import StreamRewriter, event_json

TRICKY = "a\u2028b\u2029c\x85d\x1ce\u00e9\U0001f600"


def test_event_json_escapes_what_line_readers_break_at_and_keeps_the_text() -> None:
    data = event_json({"content": TRICKY})
    assert len(data.decode().splitlines()) == 1
    assert json.loads(data) == {"content": TRICKY}


@pytest.mark.asyncio(loop_scope="function")
async def test_a_chat_stream_with_such_a_token_reads_whole_with_httpx_lines() -> None:
    rewriter = StreamRewriter("composer-2.5", "fast", include_usage=False, continuous_usage=False)
    choice = {"index": 0, "delta": {"content": TRICKY}, "finish_reason": None}
    upstream = {"id": "c1", "object": "chat.completion.chunk", "model": "m", "choices": [choice]}
    raw = b"data: " + json.dumps(upstream, ensure_ascii=False).encode() + b"\n\ndata: [DONE]\n\n"
    body = b"".join(rewriter.feed(raw))
    response = httpx.Response(200, content=body)
    lines = [line async for line in response.aiter_lines() if line]
    assert len(lines) == 2 and lines[1] == "data: [DONE]"
    assert json.loads(lines[0][6:])["choices"][0]["delta"]["content"] == TRICKY
