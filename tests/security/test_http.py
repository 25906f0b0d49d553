"""Hostile HTTP against a live `cstack gateway` (billing on, the Stripe webhook mounted):
no 5xx, no hang, no leak of internal addresses, no bypass of a limit.

The upstream is a raw-socket stand-in for vLLM that can answer 4xx and 5xx, and stream
without end (to see a slow reader slow the upstream down); the standard tier points at a
port nobody listens on. Timeouts in this file bound how long a test may hang; none is an
assertion about speed.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import socket
import sys
import threading
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from urllib.parse import urlparse

import httpx
import pytest

from billing.ledger import make_engine, migrate
from serving.process import ManagedProcess, free_port

ADMIN_TOKEN = "security-admin-token"
WEBHOOK_SECRET = "whsec_security"
#: What the stand-in puts in its 5xx bodies: the client must never see it.
ENGINE_SECRET = "engine-internal-detail-7f3a"
#: Bytes the endless stream tries to send; a slow reader must hold the gateway far below.
ENDLESS_BYTES = 512 * 1024 * 1024
#: How long the live gateway lets a client take nothing (CSTACK_SEND_TIMEOUT_S).
SEND_TIMEOUT_S = 12


class UpstreamStandIn:
    """Speaks enough HTTP/1.1 for the gateway: health checks, and chat completions whose
    last user message picks the answer (``please-400``, ``please-500``, ``endless``)."""

    def __init__(self) -> None:
        self.server = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.server.getsockname()[1]}"
        self.endless_sent = 0
        self.endless_closed = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                connection, _ = self.server.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(connection,), daemon=True).start()

    def _serve(self, connection: socket.socket) -> None:
        buffer = b""
        with connection:
            while True:
                while b"\r\n\r\n" not in buffer:
                    data = connection.recv(65536)
                    if not data:
                        return
                    buffer += data
                head, _, buffer = buffer.partition(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n")[1:]:
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                while len(buffer) < length:
                    buffer += connection.recv(65536)
                body, buffer = buffer[:length], buffer[length:]
                if head.startswith(b"GET"):
                    self._reply(connection, 200, {"object": "list", "data": []})
                elif b"please-400" in body:
                    self._reply(connection, 400, {"error": {"message": "max_tokens too large"}})
                elif b"please-500" in body:
                    self._reply(connection, 500, {"error": {"message": ENGINE_SECRET}})
                elif b"endless" in body:
                    self._endless(connection)
                    return
                else:
                    self._short_stream(connection)

    @staticmethod
    def _reply(connection: socket.socket, status: int, body: Mapping[str, object]) -> None:
        content = json.dumps(body).encode()
        connection.sendall(
            f"HTTP/1.1 {status} X\r\ncontent-type: application/json\r\n"
            f"content-length: {len(content)}\r\n\r\n".encode()
            + content
        )

    @staticmethod
    def _chunk(event: Mapping[str, object]) -> bytes:
        data = b"data: " + json.dumps(event).encode() + b"\n\n"
        return b"%x\r\n%s\r\n" % (len(data), data)

    def _stream_head(self, connection: socket.socket) -> None:
        connection.sendall(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
            b"transfer-encoding: chunked\r\n\r\n"
        )

    def _short_stream(self, connection: socket.socket) -> None:
        self._stream_head(connection)
        usage = {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}
        delta = {"index": 0, "delta": {"content": "ok"}, "finish_reason": "stop"}
        event = {"id": "c", "object": "chat.completion.chunk", "choices": [delta], "usage": usage}
        connection.sendall(
            self._chunk(event)
            + self._chunk({"id": "c", "object": "chat.completion.chunk", "choices": [],
                           "usage": usage})
            + b"e\r\ndata: [DONE]\n\n\r\n0\r\n\r\n"
        )  # fmt: skip

    def _endless(self, connection: socket.socket) -> None:
        self._stream_head(connection)
        text = "x" * 4000
        try:
            for index in range(ENDLESS_BYTES // 4096):
                usage = {"prompt_tokens": 3, "completion_tokens": index + 1}
                choice = {"index": 0, "delta": {"content": text}, "finish_reason": None}
                event = {"id": "e", "object": "chat.completion.chunk", "choices": [choice],
                         "usage": usage}  # fmt: skip
                chunk = self._chunk(event)
                connection.sendall(chunk)
                self.endless_sent += len(chunk)
        except OSError:
            pass
        self.endless_closed.set()

    def close(self) -> None:
        self.server.close()


@dataclass
class LiveGateway:
    url: str
    internal_url: str
    ledger_url: str
    upstream: UpstreamStandIn
    api_key: str


@pytest.fixture(scope="module")
def live(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveGateway]:
    tmp = tmp_path_factory.mktemp("security-http")
    upstream = UpstreamStandIn()
    port, internal_port = free_port(), free_port()
    ledger_url = f"sqlite:///{tmp / 'ledger.db'}"
    migrate(make_engine(ledger_url))
    suffix = uuid.uuid4().hex[:8]
    env = {
        "CSTACK_PORT": str(port),
        "CSTACK_INTERNAL_PORT": str(internal_port),
        "CSTACK_FAST_UPSTREAM_URLS": upstream.url,
        "CSTACK_STANDARD_UPSTREAM_URLS": f"http://127.0.0.1:{free_port()}",  # nobody there
        "CSTACK_HEALTH_INTERVAL_S": "0.5",
        "CSTACK_REDIS_URL": redis_url,
        "CSTACK_ADMIN_TOKEN": ADMIN_TOKEN,
        "CSTACK_LEDGER_URL": ledger_url,
        "CSTACK_USAGE_STREAM": f"cstack:usage:security:{suffix}",
        "CSTACK_USAGE_SPOOL_DIR": str(tmp / "spool"),
        "CSTACK_STRIPE_WEBHOOK_SECRET": WEBHOOK_SECRET,
        "CSTACK_HEADER_TIMEOUT_S": "1",
        "CSTACK_BODY_TIMEOUT_S": "1",
        # Longer than the slow reader's wait below (it must not be cut off first).
        "CSTACK_SEND_TIMEOUT_S": str(SEND_TIMEOUT_S),
    }
    gateway = ManagedProcess(
        "gateway",
        [sys.executable, "-m", "deploy.cli", "gateway", "--log-level", "warning"],
        tmp / "gateway.log",
        f"http://127.0.0.1:{port}/healthz",
        env,
    )
    gateway.start()
    try:
        gateway.wait_healthy(timeout_s=60)
        internal_url = f"http://127.0.0.1:{internal_port}"
        admin = {"authorization": f"Bearer {ADMIN_TOKEN}"}
        org = f"sec-{suffix}"
        created = httpx.post(
            f"{internal_url}/admin/orgs", json={"org_id": org, "plan": "pro"}, headers=admin
        )
        assert created.status_code == 201, created.text
        key = httpx.post(f"{internal_url}/admin/orgs/{org}/keys", headers=admin).json()["key"]
        yield LiveGateway(f"http://127.0.0.1:{port}", internal_url, ledger_url, upstream, key)
    finally:
        gateway.stop()
        upstream.close()


def raw_exchange(url: str, request: bytes, timeout_s: float = 30.0) -> bytes:
    """Send ``request`` on a fresh connection; everything the server sent until it closed."""
    target = urlparse(url)
    with socket.create_connection((target.hostname, target.port), timeout=timeout_s) as sock:
        # The server may answer and close before it has read everything.
        with contextlib.suppress(OSError):
            sock.sendall(request)
        received = b""
        while True:
            try:
                data = sock.recv(65536)
            except ConnectionResetError:
                return received
            if not data:
                return received
            received += data


def status_of(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/1.1 ") else 0


def chat(live: LiveGateway, content: str, **extra: object) -> httpx.Response:
    body = {"model": "composer-2.5-fast", "messages": [{"role": "user", "content": content}]}
    return httpx.post(
        f"{live.url}/v1/chat/completions",
        json={**body, **extra},
        headers={"authorization": f"Bearer {live.api_key}"},
        timeout=30,
    )


def test_metrics_and_admin_answer_only_on_the_internal_listener(live: LiveGateway) -> None:
    admin = {"authorization": f"Bearer {ADMIN_TOKEN}"}
    assert httpx.get(f"{live.url}/metrics").status_code == 404
    assert httpx.get(f"{live.url}/admin/orgs/anything", headers=admin).status_code == 404
    assert httpx.get(f"{live.internal_url}/metrics").status_code == 200
    auth = {"authorization": f"Bearer {live.api_key}"}
    assert httpx.get(f"{live.internal_url}/v1/models", headers=auth).status_code == 404
    for path in ("/v1/chat/completions", "/v1/completions", "/v1/responses"):
        generation = httpx.post(f"{live.internal_url}{path}", headers=auth, json={})
        assert generation.status_code == 404, path
        assert generation.json()["error"]["code"] == "not_found"
    assert httpx.get(f"{live.url}/v1/models", headers=auth).status_code == 200
    for url in (live.url, live.internal_url):
        assert httpx.get(f"{url}/healthz").status_code == 200


def test_oversized_heads_get_a_431(live: LiveGateway) -> None:
    huge = b"GET /healthz HTTP/1.1\r\nhost: x\r\nx-big: " + b"a" * (1024 * 1024) + b"\r\n\r\n"
    answer = raw_exchange(live.url, huge)
    assert status_of(answer) == 431
    assert b"request_header_fields_too_large" in answer
    many = b"".join(b"x-h%d: v\r\n" % i for i in range(200))
    answer = raw_exchange(live.url, b"GET /healthz HTTP/1.1\r\nhost: x\r\n" + many + b"\r\n")
    assert status_of(answer) == 431


def test_slow_heads_and_idle_connections_are_dropped(live: LiveGateway) -> None:
    # A slow-loris client: a head that never ends. The server closes the connection
    # (CSTACK_HEADER_TIMEOUT_S=1 here); recv returning means it was not held open.
    assert raw_exchange(live.url, b"GET /healthz HTTP/1.1\r\nhost: x\r\nx-slow: 1\r\n") == b""
    assert raw_exchange(live.url, b"") == b""


def test_a_stalled_body_is_dropped(live: LiveGateway) -> None:
    head = (
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        b"authorization: Bearer " + live.api_key.encode() + b"\r\ncontent-length: 1000\r\n\r\n"
    )
    answer = raw_exchange(live.url, head + b'{"model":')
    assert status_of(answer) in (0, 400, 408)


def test_no_redirect_is_built_from_the_host_header(live: LiveGateway) -> None:
    auth = {"authorization": f"Bearer {live.api_key}", "host": "evil.example"}
    for path in ("/v1/models/", "/v1/chat/completions/", "//evil.example/v1/models"):
        response = httpx.get(f"{live.url}{path}", headers=auth, follow_redirects=False)
        assert response.status_code == 404, path
        assert "location" not in response.headers


def test_head_and_unknown_methods_get_proper_answers(live: LiveGateway) -> None:
    assert httpx.head(f"{live.url}/v1/models").status_code == 401
    auth = {"authorization": f"Bearer {live.api_key}"}
    assert httpx.head(f"{live.url}/v1/models", headers=auth).status_code == 200
    assert httpx.head(f"{live.url}/healthz").status_code == 200
    for method, path in (
        ("PATCH", "/v1/models"),
        ("DELETE", "/v1/chat/completions"),
        ("GET", "/v1/completions"),
        ("HEAD", "/v1/responses"),
    ):
        response = httpx.request(method, f"{live.url}{path}", headers=auth)
        assert response.status_code == 405
        assert response.headers["allow"]
        if method != "HEAD":
            assert response.json()["error"]["code"] == "method_not_allowed"
    assert httpx.delete(f"{live.url}/v1/chat/completions").headers["allow"] == "POST"


def test_the_webhook_refuses_before_reading_a_large_body(live: LiveGateway) -> None:
    webhook = "/v1/billing/stripe/webhook"
    unsigned = httpx.post(f"{live.url}{webhook}", content=b"{}")
    assert unsigned.status_code == 400
    assert unsigned.json()["error"]["code"] == "invalid_signature"
    # 20 MB declared, none sent: answered at once (a body this size is never read).
    head = (
        f"POST {webhook} HTTP/1.1\r\nhost: x\r\nstripe-signature: t=1,v1=00\r\n"
        "content-type: application/json\r\ncontent-length: 20000000\r\n\r\n"
    ).encode()
    assert status_of(raw_exchange(live.url, head)) == 413

    # Undeclared (chunked): reading stops at the limit.
    def body() -> Iterator[bytes]:
        for _ in range(64):
            yield b"x" * 65536

    chunked = httpx.post(
        f"{live.url}{webhook}", content=body(), headers={"stripe-signature": "t=1,v1=00"}
    )
    assert chunked.status_code == 413


def test_error_bodies_name_no_internal_address(live: LiveGateway) -> None:
    down = httpx.post(
        f"{live.url}/v1/chat/completions",
        json={"model": "composer-2.5-standard", "messages": [{"role": "user", "content": "hi"}]},
        headers={"authorization": f"Bearer {live.api_key}"},
        timeout=30,
    )
    assert down.status_code == 503
    assert "127.0.0.1" not in down.text and "http://" not in down.text
    failed = chat(live, "please-500")
    assert failed.status_code == 502
    assert ENGINE_SECRET not in failed.text and live.upstream.url not in failed.text


def test_upstream_4xx_passes_on_as_4xx(live: LiveGateway) -> None:
    refused = chat(live, "please-400")
    assert refused.status_code == 400
    assert refused.json()["error"]["message"] == "max_tokens too large"
    assert chat(live, "hello").status_code == 200


def test_an_invalid_json_schema_is_a_400(live: LiveGateway) -> None:
    schemas: list[dict[str, object]] = [{"type": 12}, {"properties": []}, {"$ref": 5}]
    for schema in schemas:
        response_format = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
        answer = chat(live, "hello", response_format=response_format)
        assert answer.status_code == 400, schema
        assert "response_format" in (answer.json()["error"]["param"] or "")


def test_every_usage_date_combination_is_a_200_or_a_400(live: LiveGateway) -> None:
    today = datetime.now(UTC).date()
    dates = [
        None,
        "",
        "0001-01-01",
        (today - timedelta(days=400)).isoformat(),
        today.isoformat(),
        (today + timedelta(days=40)).isoformat(),
        "9999-12-31",
        "2026-02-30",
        "yesterday",
        "2026-1-1",
    ]
    auth = {"authorization": f"Bearer {live.api_key}"}
    for start in dates:
        for end in dates:
            params = {k: v for k, v in (("start", start), ("end", end)) if v is not None}
            response = httpx.get(f"{live.url}/v1/usage", params=params, headers=auth)
            assert response.status_code in (200, 400), (params, response.text)
            if response.status_code == 400:
                assert response.json()["error"]["param"] in ("start", "end"), params


def test_admin_ids_that_no_org_can_have_are_unknown(live: LiveGateway) -> None:
    admin = {"authorization": f"Bearer {ADMIN_TOKEN}"}
    for bad in ("x:keys", "sec%3Akeys", "a%0A", "-leading", "x" * 300, "%00"):
        for path in (f"/admin/orgs/{bad}", f"/admin/orgs/{bad}/keys"):
            response = httpx.get(f"{live.internal_url}{path}", headers=admin)
            assert response.status_code == 404, (path, response.text)
        revoke = httpx.post(f"{live.internal_url}/admin/keys/{bad}/revoke", headers=admin)
        assert revoke.status_code == 404


def test_a_slow_reader_slows_the_upstream_instead_of_filling_the_gateway(
    live: LiveGateway,
) -> None:
    body = {
        "model": "composer-2.5-fast",
        "messages": [{"role": "user", "content": "endless"}],
        "stream": True,
    }
    headers = {"authorization": f"Bearer {live.api_key}"}
    with httpx.stream(
        "POST", f"{live.url}/v1/chat/completions", json=body, headers=headers, timeout=60
    ) as response:
        assert response.status_code == 200
        # Read nothing more: wait until the upstream cannot send any further.
        last, steady_since = -1, time.monotonic()
        while time.monotonic() - steady_since < 3:
            if live.upstream.endless_sent != last:
                last, steady_since = live.upstream.endless_sent, time.monotonic()
            assert not live.upstream.endless_closed.is_set(), "the upstream sent everything"
            time.sleep(0.2)
        # Socket buffers on three hops plus the gateway's own bounded buffer: megabytes,
        # not the half gigabyte the upstream would send.
        assert live.upstream.endless_sent < 64 * 1024 * 1024
    # The client hung up: the gateway closes the upstream connection.
    assert live.upstream.endless_closed.wait(timeout=30)


def test_a_client_that_stops_reading_for_good_is_cut_off(live: LiveGateway) -> None:
    """It neither reads nor hangs up: after CSTACK_SEND_TIMEOUT_S of taking nothing the
    gateway drops its connection and the upstream's, instead of holding both (and the
    engine's sequence) until the request's maximum duration."""
    live.upstream.endless_closed.clear()  # the test before let its stream go
    body = json.dumps(
        {"model": "composer-2.5-fast", "messages": [{"role": "user", "content": "endless"}],
         "stream": True}
    ).encode()  # fmt: skip
    target = urlparse(live.url)
    with socket.create_connection((target.hostname, target.port), timeout=60) as sock:
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json"
            b"\r\nauthorization: Bearer " + live.api_key.encode()
            + b"\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body)
        )  # fmt: skip
        # Reading nothing, holding the connection open: the gateway lets the upstream go.
        assert live.upstream.endless_closed.wait(timeout=SEND_TIMEOUT_S + 60)
        # And this connection: what it had buffered, then its end (or a reset).
        received = b""
        with contextlib.suppress(ConnectionResetError):
            while data := sock.recv(1024 * 1024):
                received += data
        assert received.startswith(b"HTTP/1.1 200 ")


def test_garbage_never_gets_a_5xx(live: LiveGateway) -> None:
    auth = {"authorization": f"Bearer {live.api_key}", "content-type": "application/json"}
    bodies = [
        b"",
        b"{",
        b"[]",
        b"null",
        b'{"model": "composer-2.5-fast", "messages": "nope"}',
        b'{"model": "composer-2.5-fast", "messages": [], "n": 100000}',
        b'{"model": "composer-2.5-fast", "messages": [{"role": "user", "content": "\xff"}]}',
        b'{"model": "composer-2.5-fast", "messages": [{"role": "user"}], "max_tokens": -1}',
        b'{"model": "nope", "messages": [{"role": "user", "content": "hi"}]}',
        b"x" * (5 * 1024 * 1024),
    ]
    for body in bodies:
        response = httpx.post(f"{live.url}/v1/chat/completions", content=body, headers=auth)
        assert 400 <= response.status_code < 500, (body[:60], response.text)
        assert response.json()["error"]["message"]
    weird_auth = {"authorization": "Bearer " + "k" * 10000}
    assert httpx.get(f"{live.url}/v1/models", headers=weird_auth).status_code == 401


def test_errors_repeat_at_most_a_bounded_part_of_what_was_sent(live: LiveGateway) -> None:
    huge = "m" * 1_000_000
    hi = [{"role": "user", "content": "hi"}]
    sent = [
        {"model": huge, "messages": [{"role": "user", "content": "hi"}]},
        {"model": "composer-2.5", "service_tier": huge, "messages": hi},
        {"model": "composer-2.5-fast", "messages": [{"role": huge, "content": "hi"}]},
        {"model": "composer-2.5-fast", "messages": [{"role": "user", "content": "hi"}], huge: 1},
    ]  # fmt: skip
    auth = {"authorization": f"Bearer {live.api_key}"}
    for body in sent:
        answer = httpx.post(f"{live.url}/v1/chat/completions", json=body, headers=auth, timeout=30)
        assert answer.status_code in (400, 404), answer.text[:300]
        assert len(answer.content) < 2_000, answer.text[:300]
        assert answer.json()["error"]["message"]


def test_request_ids_tell_nothing_of_other_traffic(live: LiveGateway) -> None:
    """Ids that count up would let any customer measure every tenant's request rate."""
    ids = [httpx.get(f"{live.url}/healthz").headers["x-request-id"] for _ in range(20)]
    assert len(set(ids)) == len(ids)
    bodies = [identifier.removeprefix("req_") for identifier in ids]

    def shared(texts: list[str]) -> int:
        columns = enumerate(zip(*texts, strict=False))
        return next((i for i, chars in columns if len(set(chars)) > 1), 0)

    # No shared prefix or suffix beyond chance, no two consecutive ids close together.
    assert shared(bodies) <= 2
    assert shared([body[::-1] for body in bodies]) <= 2
    numbers = [int(body, 16) for body in bodies if all(c in "0123456789abcdef" for c in body)]
    assert not any(abs(b - a) < 2**32 for a, b in itertools.pairwise(numbers))


def test_a_pattern_the_engine_cannot_compile_is_a_400_naming_the_field(
    live: LiveGateway,
) -> None:
    """vLLM answers these with a bare 500 (or compiles one for tens of seconds)."""
    for pattern in ("^(a{1,200}){1,200}$", "^a{1,1000}$", "^(a{1,50}){1,50}$"):
        schema = {"type": "object", "properties": {"a": {"type": "string", "pattern": pattern}}}
        response_format = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
        answer = chat(live, "hello", response_format=response_format)
        assert answer.status_code == 400, (pattern, answer.text)
        error = answer.json()["error"]
        assert error["param"].startswith("response_format"), error
        assert "properties.a.pattern" in error["message"], error
    schema = {"type": "object", "properties": {"a": {"type": "string", "pattern": "^[a-z]{1,20}$"}}}
    response_format = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    assert chat(live, "hello", response_format=response_format).status_code == 200
