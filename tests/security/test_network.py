"""Network credentials, live: the embedded Valkey as `cstack up` starts it requires its
password, vLLM (its real app, built from the arguments and environment our launcher
gives it) refuses /v1/* without its key, and each client of vLLM sends the key.

vLLM's dev endpoints are not behind its key; the test below that shows it is why the
chart keeps vLLM's port to the gateway and trainer and scrapes a metrics relay instead.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import stat
import subprocess
import sys
import threading
from collections.abc import Iterator
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from deploy.settings import DeploySettings
from deploy.stack import LocalStack
from gateway.upstream.http1 import ConnectionPool
from serving.engine import engine_for_variant
from serving.metrics_relay import make_handler
from serving.process import free_port
from serving.redact import redact_url
from serving.valkey import read_or_create_secret

KEY = "test-vllm-key"


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _raw(port: int, request: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(request)
        return sock.recv(256)


# --- Redis: the embedded Valkey `cstack up` starts ---


@pytest.fixture
def local_redis(tmp_path: Path) -> Iterator[tuple[LocalStack, list[str]]]:
    said: list[str] = []
    stack = LocalStack(DeploySettings(state_dir=tmp_path / "state"), say=said.append)
    stack.start_redis()
    try:
        yield stack, said
    finally:
        stack.stop()


def test_embedded_valkey_refuses_commands_without_the_password(
    local_redis: tuple[LocalStack, list[str]],
) -> None:
    stack, _ = local_redis
    assert stack.redis_url is not None
    port = redis.Redis.from_url(stack.redis_url).connection_pool.connection_kwargs["port"]
    assert _raw(port, b"*1\r\n$4\r\nPING\r\n").startswith(b"-NOAUTH")
    assert _raw(port, b"*2\r\n$4\r\nAUTH\r\n$5\r\nguess\r\n").startswith(b"-WRONGPASS")
    with pytest.raises(redis.AuthenticationError):
        redis.Redis(host="127.0.0.1", port=port).set("cstack:test:forged", "1")

    client = redis.Redis.from_url(stack.redis_url)
    assert client.set("cstack:test:auth", "1") and client.get("cstack:test:auth") == b"1"
    client.close()


def test_the_password_is_kept_private_and_never_printed(
    local_redis: tuple[LocalStack, list[str]],
) -> None:
    stack, said = local_redis
    state = stack.settings.state_dir
    password = (state / "valkey-password").read_text().strip()
    assert len(password) >= 32
    assert _mode(state / "valkey-password") == 0o600
    # The URL file the CLI reads while the stack runs, and the include valkey-server reads.
    assert _mode(stack.redis_url_path) == 0o600
    assert password in stack.redis_url_path.read_text()
    assert _mode(state / "valkey" / "auth.conf") == 0o600
    assert password not in (state / "valkey" / "valkey.conf").read_text()
    assert said and not [line for line in said if password in line]
    assert any(redact_url(str(stack.redis_url)) in line for line in said)


def test_a_restart_keeps_the_password_and_the_data(tmp_path: Path) -> None:
    settings = DeploySettings(state_dir=tmp_path / "state")
    first = LocalStack(settings, say=lambda _line: None)
    first.start_redis()
    assert first.redis_url is not None
    redis.Redis.from_url(first.redis_url).set("cstack:test:kept", "1")
    first.stop()
    assert not first.redis_url_path.exists()  # gone with the server it pointed at

    second = LocalStack(settings, say=lambda _line: None)
    second.start_redis()
    try:
        assert second.redis_url is not None
        assert redis.Redis.from_url(second.redis_url).get("cstack:test:kept") == b"1"
    finally:
        second.stop()


def test_cli_commands_find_the_running_embedded_valkey(
    local_redis: tuple[LocalStack, list[str]],
) -> None:
    """`cstack keys` without CSTACK_REDIS_URL, next to a running `cstack up`."""
    stack, _ = local_redis
    env = {k: v for k, v in os.environ.items() if k != "CSTACK_REDIS_URL"}
    env["CSTACK_STATE_DIR"] = str(stack.settings.state_dir)
    cstack = [sys.executable, "-m", "deploy.cli"]
    created = subprocess.run(
        [*cstack, "keys", "create", "--org", "netcheck", "--name", "cli"],
        env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert created.returncode == 0, created.stderr
    assert "org: netcheck" in created.stdout
    listed = subprocess.run(
        [*cstack, "keys", "list", "--org", "netcheck"],
        env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert listed.returncode == 0 and "\tactive\t" in listed.stdout, listed.stderr


def test_secret_files_are_private_from_creation(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "vllm-api-key"
    secret = read_or_create_secret(path)
    assert _mode(path) == 0o600 and len(secret) >= 32
    path.chmod(0o644)
    assert read_or_create_secret(path) == secret and _mode(path) == 0o600


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://:s3cret@h:6379/0", "redis://:***@h:6379/0"),
        ("rediss://app:s3cret@h:6380/0?ssl_cert_reqs=required",
         "rediss://app:***@h:6380/0?ssl_cert_reqs=required"),
        ("redis://h:6379/0?password=s3cret", "redis://h:6379/0?password=***"),
        ("redis://s3cret@h:6379", "redis://***@h:6379"),
        ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"),
        ("garbage s3cret@", "***"),
    ],
)  # fmt: skip
def test_urls_are_printed_without_credentials(url: str, shown: str) -> None:
    assert redact_url(url) == shown


# --- vLLM: its key, its dev endpoints, and every client that sends the key ---

# Builds vLLM's FastAPI app (routes and middleware, no engine) from argv and the
# environment, in a child process because vLLM reads its environment once per process,
# and prints what each request answered.
_VLLM_APP = """
import asyncio, json, sys
import httpx
from vllm.entrypoints.launchers.app import build_app
from vllm.entrypoints.launchers.cli_args import make_arg_parser
from vllm.utils.argparse_utils import FlexibleArgumentParser

argv, requests = json.loads(sys.stdin.read())
app = build_app(make_arg_parser(FlexibleArgumentParser()).parse_args(argv), ("generate",))

async def main():
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://vllm") as client:
        codes = []
        for method, path, key in requests:
            headers = {"authorization": f"Bearer {key}"} if key else {}
            codes.append((await client.request(method, path, headers=headers, json={})).status_code)
        print(json.dumps(codes))

asyncio.run(main())
"""


def _vllm_answers(weight_sync: bool, requests: list[tuple[str, str, str | None]]) -> list[int]:
    server = engine_for_variant("shared", Path("/models/none"), 8100, weight_sync=weight_sync,
                                api_key=KEY)  # fmt: skip
    assert KEY not in server.command  # the key travels in the environment only
    argv = server.command[server.command.index("vllm.entrypoints.openai.api_server") + 1 :]
    env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_")} | server.env
    done = subprocess.run(
        [sys.executable, "-c", _VLLM_APP], input=json.dumps([argv, requests]), env=env,
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    codes: list[int] = json.loads(done.stdout.strip().splitlines()[-1])
    return codes


def test_vllm_started_with_the_key_refuses_v1_without_it() -> None:
    codes = _vllm_answers(
        weight_sync=False,
        requests=[
            ("GET", "/v1/models", None),
            ("GET", "/v1/models", "wrong"),
            ("POST", "/v1/completions", None),
            ("GET", "/v1/models", KEY),
            ("POST", "/collective_rpc", None),
            ("POST", "/sleep", None),
        ],
    )
    assert codes[:3] == [401, 401, 401]
    assert codes[3] != 401  # the key passes (no engine behind this app to answer more)
    # Without weight sync the dev endpoints do not exist at all.
    assert codes[4:] == [404, 404]


def test_vllm_dev_endpoints_exist_only_with_weight_sync_and_ignore_the_key() -> None:
    """Why the chart keeps vLLM's port to the gateway and trainer: with weight sync on,
    /collective_rpc and /pause answer requests that carry no key at all."""
    codes = _vllm_answers(
        weight_sync=True,
        requests=[("POST", "/collective_rpc", None), ("GET", "/is_paused", None),
                  ("GET", "/v1/models", None)],
    )  # fmt: skip
    assert 404 not in codes[:2] and 401 not in codes[:2]
    assert codes[2] == 401


class _KeyedEngine(BaseHTTPRequestHandler):
    """A stand-in vLLM with vLLM's rule: /v1/* needs the key, other routes do not."""

    seen: list[tuple[str, str | None]] = []

    def _answer(self) -> None:
        auth = self.headers.get("authorization")
        type(self).seen.append((self.path, auth))
        if self.path.startswith("/v1") and auth != f"Bearer {KEY}":
            body, status = b'{"error": "Unauthorized"}', HTTPStatus.UNAUTHORIZED
        elif self.path == "/v1/models":
            body = json.dumps({"data": [{"id": "m", "max_model_len": 4096}]}).encode()
            status = HTTPStatus.OK
        elif self.path == "/weight_info":
            body, status = b'{"weight_version": "7"}', HTTPStatus.OK
        elif self.path == "/metrics":
            body, status = b"vllm:num_requests_running 0\n", HTTPStatus.OK
        else:
            body, status = b"{}", HTTPStatus.OK
        self.send_response(status)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        self._answer()

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length", 0)))
        self._answer()

    def log_message(self, format: str, *args: Any) -> None:
        pass


def _serve(handler: type[BaseHTTPRequestHandler]) -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def keyed_engine() -> Iterator[str]:
    _KeyedEngine.seen = []
    yield from _serve(_KeyedEngine)


def test_gateway_sends_the_key_on_requests_and_health_checks(keyed_engine: str) -> None:
    from gateway.metrics import GatewayMetrics
    from gateway.upstream.pools import Upstreams

    async def exchange(api_key: str | None) -> tuple[int | None, int]:
        upstreams = Upstreams(
            {"fast": [keyed_engine], "standard": [keyed_engine]}, GatewayMetrics(),
            connect_timeout_s=2, read_timeout_s=5, max_connections=4, health_interval_s=60,
            health_timeout_s=2, api_key=api_key,
        )  # fmt: skip
        await upstreams.start()
        try:
            replica = upstreams.replicas[keyed_engine]
            response = await replica.client.request("/v1/completions", b"{}", {})
            await response.read()
            response.close()
            return replica.max_model_len, response.status
        finally:
            await upstreams.aclose()

    # Without the key the engine's context length stays unknown and requests are refused.
    assert asyncio.run(exchange(None)) == (None, 401)
    assert asyncio.run(exchange(KEY)) == (4096, 200)
    keyed = [auth for path, auth in _KeyedEngine.seen[-3:]]
    assert keyed == [f"Bearer {KEY}"] * 3  # /health, /v1/models, /v1/completions


def test_the_upstream_key_cannot_inject_headers() -> None:
    async def build() -> None:
        ConnectionPool("http://127.0.0.1:1", limit=1, connect_timeout_s=1, read_timeout_s=1,
                       api_key="k\r\nx-evil: 1")  # fmt: skip

    with pytest.raises(ValueError, match="printable"):
        asyncio.run(build())


def test_weight_sync_sends_the_configured_key(
    keyed_engine: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from training.rl.rollouts.weight_sync import VllmWeightSync

    monkeypatch.setenv("CSTACK_VLLM_API_KEY", KEY)
    sync = VllmWeightSync([keyed_engine], gate=None)  # type: ignore[arg-type]
    assert sync.engine_version(keyed_engine) == "7"
    assert _KeyedEngine.seen[-1] == ("/weight_info", f"Bearer {KEY}")
    assert KEY not in repr(sync)


def test_metrics_relay_serves_metrics_and_nothing_else(keyed_engine: str) -> None:
    for url in _serve(make_handler(f"{keyed_engine}/metrics")):
        assert httpx.get(f"{url}/metrics").text == "vllm:num_requests_running 0\n"
        for method, path in [("GET", "/v1/models"), ("POST", "/collective_rpc"),
                             ("GET", "/metrics/../pause"), ("POST", "/metrics")]:  # fmt: skip
            assert httpx.request(method, f"{url}{path}").status_code in (404, 501), path
    # The relay asked the engine for /metrics and nothing else.
    assert [path for path, _ in _KeyedEngine.seen] == ["/metrics"]


def test_metrics_relay_reports_an_unreachable_engine() -> None:
    for url in _serve(make_handler(f"http://127.0.0.1:{free_port()}/metrics")):
        assert httpx.get(f"{url}/metrics").status_code == 502
