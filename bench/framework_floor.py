"""The server framework alone, for `bench/gateway_overhead.py --framework-floor`: uvicorn
(uvloop, httptools, as the gateway runs it) serving an ASGI app that reads the request
body and answers one fixed chat completion. No auth, parsing, upstream hop or billing:
what a request costs before any of the gateway's own work.

    .venv/bin/python bench/framework_floor.py PORT
"""

from __future__ import annotations

import json
import sys
from typing import Any

ANSWER = json.dumps(
    {
        "id": "chatcmpl-floor",
        "object": "chat.completion",
        "created": 0,
        "model": "composer-2.5",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "floor " * 8},
                "finish_reason": "length",
            }
        ],
        "usage": {"prompt_tokens": 10, "completion_tokens": 8, "total_tokens": 18},
    }
).encode()
HEAD = [(b"content-type", b"application/json"), (b"content-length", str(len(ANSWER)).encode())]


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":  # lifespan: nothing to start
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        return
    more = True
    while more:
        more = (await receive()).get("more_body", False)
    await send({"type": "http.response.start", "status": 200, "headers": HEAD})
    await send({"type": "http.response.body", "body": ANSWER})


if __name__ == "__main__":
    import uvicorn

    uvicorn.run(
        app,
        host="127.0.0.1",
        port=int(sys.argv[1]),
        loop="uvloop",
        http="httptools",
        lifespan="off",
        log_level="warning",
        access_log=False,
    )
