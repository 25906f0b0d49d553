"""The request context's last resort: an exception no handler turned into an answer."""

from __future__ import annotations

import httpx
from starlette.types import Message, Receive, Scope, Send

from gateway.metrics import GatewayMetrics
from gateway.server.middleware import REQUEST_ID, RequestContextMiddleware


async def test_an_unhandled_error_is_a_500_in_openais_shape_with_the_request_id() -> None:
    seen: dict[str, str] = {}

    async def broken(scope: Scope, receive: Receive, send: Send) -> None:
        seen["id"] = scope[REQUEST_ID]
        raise RuntimeError("secret detail: postgres://user:pw@db")

    metrics = GatewayMetrics()
    app = RequestContextMiddleware(broken, metrics)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
        answer = await client.post("/v1/chat/completions", json={})
    assert answer.status_code == 500
    assert answer.json() == {
        "error": {
            "message": "internal gateway error",
            "type": "server_error",
            "param": None,
            "code": "internal_error",
        }
    }
    assert "secret" not in answer.text
    assert answer.headers["content-type"] == "application/json"
    assert int(answer.headers["content-length"]) == len(answer.content)
    assert answer.headers["x-request-id"] == seen["id"]
    labels = {"tier": "none", "route": "chat", "status": "500"}
    assert metrics.registry.get_sample_value("cstack_requests_total", labels) == 1


async def test_an_error_after_the_response_began_is_not_answered_twice() -> None:
    async def breaks_mid_answer(scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"partial", "more_body": True})
        raise RuntimeError("upstream went away")

    sent: list[Message] = []

    async def receive() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Message) -> None:
        sent.append(message)

    app = RequestContextMiddleware(breaks_mid_answer, GatewayMetrics())
    scope = {"type": "http", "path": "/v1/completions", "headers": [], "method": "POST"}
    await app(scope, receive, send)
    assert [m["type"] for m in sent] == ["http.response.start", "http.response.body"]
    assert sent[0]["status"] == 200
