"""An OpenAI-speaking upstream that streams the usage vLLM streams, fast, for load tests.

    python -m tests.support.fakes.upstream PORT   (UPSTREAM, from the repository root)

Real vLLM on two shared cores cannot serve hundreds of concurrent requests in a test's
time; this stand-in answers ``/v1/chat/completions`` and ``/v1/completions`` the way vLLM
streams them when asked for ``stream_options.continuous_usage_stats`` (what the gateway
always asks for): one chunk per token per sequence, each carrying the usage of its own
prompt and choice, then a usage-only chunk with the request's totals and ``[DONE]``.
Every prompt of a text completion runs ``n`` sequences (choice ``i`` answers prompt
``i // n``). Prompts count one token per two bytes of text (plus four per chat message),
and each sequence produces between half its ``max_tokens`` and all of them.

A request with ``seed`` ``SLOW_SEED`` is paced: it streams every token of every sequence
(``max_tokens`` of them), a quarter of a second apart. (A field the gateway passes on:
``user``, which it does not, once carried this.)
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
import time
from collections.abc import AsyncIterator
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

#: Run as a module from the repository root, as the other processes of the tests are.
UPSTREAM = [sys.executable, "-m", "tests.support.fakes.upstream"]

#: The ``seed`` of a request to pace (see the module docstring).
SLOW_SEED = 424242
SLOW_STEP_S = 0.25
MAX_MODEL_LEN = 4096


def prompt_tokens(path: str, body: dict[str, Any]) -> list[int]:
    """Tokens of each prompt (a chat has one)."""
    if path.endswith("/chat/completions"):
        messages = body.get("messages") or []
        text = sum(len(str(m.get("content") or "").encode()) for m in messages)
        return [text // 2 + 4 * len(messages)]
    prompt = body["prompt"]
    if isinstance(prompt, str):
        prompts: list[Any] = [prompt]
    elif prompt and isinstance(prompt[0], int):
        prompts = [prompt]
    else:
        prompts = prompt
    return [len(p.encode()) // 2 + 1 if isinstance(p, str) else len(p) for p in prompts]


def usage(prompt: int, completion: int) -> dict[str, int]:
    return {"prompt_tokens": prompt, "total_tokens": prompt + completion,
            "completion_tokens": completion}  # fmt: skip


async def events(path: str, body: dict[str, Any], rng: random.Random) -> AsyncIterator[bytes]:
    chat = path.endswith("/chat/completions")
    n, max_tokens, slow = body.get("n") or 1, int(body["max_tokens"]), body.get("seed") == SLOW_SEED
    prompts = prompt_tokens(path, body)
    lengths = [max_tokens if slow else rng.randint(max(1, max_tokens // 2), max_tokens)
               for _ in range(len(prompts) * n)]  # fmt: skip
    head = {"id": f"cmpl-{rng.getrandbits(64):x}", "created": int(time.time()),
            "model": body["model"],
            "object": "chat.completion.chunk" if chat else "text_completion"}  # fmt: skip

    def chunk(index: int, done: int, finish: str | None, first: bool = False) -> bytes:
        if chat:
            delta = {"role": "assistant", "content": ""} if first else {"content": "tok "}
            choice: dict[str, Any] = {"index": index, "delta": delta, "logprobs": None,
                                      "finish_reason": finish}  # fmt: skip
        else:
            choice = {"index": index, "text": "tok ", "logprobs": None, "finish_reason": finish}
        if finish:
            choice["stop_reason"] = None
        data = {**head, "choices": [choice], "usage": usage(prompts[index // n], done)}
        return b"data: " + json.dumps(data).encode() + b"\n\n"

    if chat:
        for index in range(n):
            yield chunk(index, 0, None, first=True)
    for step in range(max_tokens):
        for index, length in enumerate(lengths):
            if step < length:
                last = step + 1 == length
                yield chunk(
                    index,
                    step + 1,
                    ("length" if length == max_tokens else "stop") if last else None,
                )
        await asyncio.sleep(SLOW_STEP_S if slow else 0)
    total = usage(sum(prompts), sum(lengths))
    yield b"data: " + json.dumps({**head, "choices": [], "usage": total}).encode() + b"\n\n"
    yield b"data: [DONE]\n\n"


async def generate(request: Request) -> Response:
    body = json.loads(await request.body())
    rng = random.Random(request.headers.get("x-request-id"))
    return StreamingResponse(events(request.url.path, body, rng), media_type="text/event-stream")


async def health(request: Request) -> Response:
    return Response()


async def models(request: Request) -> Response:
    return JSONResponse({"object": "list", "data": [
        {"id": "composer-2.5", "object": "model", "max_model_len": MAX_MODEL_LEN}]})  # fmt: skip


app = Starlette(
    routes=[
        Route("/v1/chat/completions", generate, methods=["POST"]),
        Route("/v1/completions", generate, methods=["POST"]),
        Route("/health", health),
        Route("/v1/models", models),
    ]
)

if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
