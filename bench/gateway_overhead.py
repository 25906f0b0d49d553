"""What the gateway adds: the same load straight to an upstream and through `cstack gateway`.

One run starts a fast OpenAI-speaking upstream (its own process, a raw asyncio HTTP
server answering canned completions and SSE streams), an embedded Valkey holding one API
key, and the real gateway (`python -m deploy.cli gateway`, its own process) in front of
the upstream. It then sends identical requests, alternately direct and via the gateway:

1. paced at --rate requests/s (open loop, latency measured from the scheduled send time
   so queueing counts): p50/p99 latency each way and the added p50/p99;
2. closed loop at the concurrency that runs the direct path at --rate (rate x the
   upstream's answer time): throughput each way and the ratio;

for non-streaming requests and for short streams (time to first event and to the end).
With --vllm-url it also compares time-to-first-token against a real vLLM at low load.

    .venv/bin/python bench/gateway_overhead.py [--rate 500] [--seconds 10] [--vllm-url URL]

Not the production configuration: the gateway runs with billing off and engine admission
off, so these are the relay's own costs. Measuring billing on as the headline, with billing
off as a labelled extra row, is still to do.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import cast

ROOT = Path(__file__).resolve().parents[1]
CHAT_BODY = {
    "model": "composer-2.5",
    "messages": [{"role": "user", "content": "hi"}],
    "max_tokens": 8,
}
STREAM_EVENTS = 8


# --- the fast upstream (runs in its own process: --serve-upstream PORT) -------------------


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
    bursts, half the events at ``delay_s / 2``, so relaying is interleaved with waiting."""

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
            elif b'"stream":true' in body:
                half = len(self.STREAM) // 2
                self.loop.call_later(self.delay_s / 2, self.write, self.STREAM[:half])
                self.loop.call_later(self.delay_s, self.write, self.STREAM[half:])
            else:
                self.loop.call_later(self.delay_s, self.write, self.PLAIN)


async def serve_upstream(port: int, delay_s: float) -> None:
    UpstreamProtocol.delay_s = delay_s
    server = await asyncio.get_running_loop().create_server(UpstreamProtocol, "127.0.0.1", port)
    print("ready", flush=True)
    await server.serve_forever()


# --- the load generator -----------------------------------------------------------------


class Connection:
    """A keep-alive HTTP/1.1 connection that sends prebuilt requests (as lean as a client gets)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    async def exchange(self, request: bytes) -> float:
        """Send one request, read the whole response; seconds until the first body event."""
        started = time.perf_counter()
        self.writer.write(request)
        head = await self.reader.readuntil(b"\r\n\r\n")
        if not head.startswith(b"HTTP/1.1 200"):
            raise RuntimeError(f"unexpected response: {head[:200]!r}")
        lowered = head.lower()
        if b"transfer-encoding: chunked" not in lowered:
            at = lowered.index(b"content-length:") + 15
            await self.reader.readexactly(int(lowered[at : lowered.index(b"\r\n", at)]))
            return time.perf_counter() - started
        first_event = 0.0
        while True:
            size = int((await self.reader.readuntil(b"\r\n")).strip(), 16)
            await self.reader.readexactly(size + 2)
            if not first_event:
                first_event = time.perf_counter() - started
            if size == 0:
                return first_event


def build_request(port: int, path: str, body: dict[str, object], key: str | None) -> bytes:
    payload = json.dumps(body, separators=(",", ":")).encode()
    auth = f"authorization: Bearer {key}\r\n" if key else ""
    return (
        f"POST {path} HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\ncontent-type: application/json\r\n"
        f"{auth}content-length: {len(payload)}\r\n\r\n"
    ).encode() + payload


@dataclass
class Sample:
    latency: list[float]
    first_event: list[float]
    seconds: float

    @property
    def throughput(self) -> float:
        return len(self.latency) / self.seconds


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


async def connect_pool(port: int, size: int) -> asyncio.Queue[Connection]:
    pool: asyncio.Queue[Connection] = asyncio.Queue()
    for _ in range(size):
        pool.put_nowait(Connection(*await asyncio.open_connection("127.0.0.1", port)))
    return pool


async def run_load(
    port: int, request: bytes, concurrency: int, seconds: float, rate: float | None
) -> Sample:
    """Closed loop when ``rate`` is None, else paced at ``rate`` requests/s (open loop)."""
    pool = await connect_pool(port, concurrency)
    latency: list[float] = []
    first_event: list[float] = []

    async def one(scheduled: float) -> None:
        connection = await pool.get()
        try:
            sent = time.perf_counter()
            first = await connection.exchange(request)
            latency.append(time.perf_counter() - scheduled)
            first_event.append(sent - scheduled + first)
        finally:
            pool.put_nowait(connection)

    started = time.perf_counter()
    if rate is None:

        async def worker() -> None:
            while time.perf_counter() - started < seconds:
                await one(time.perf_counter())

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    else:
        tasks = []
        for index in range(int(rate * seconds)):
            scheduled = started + index / rate
            delay = scheduled - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(scheduled)))
        await asyncio.gather(*tasks)
    elapsed = time.perf_counter() - started
    while not pool.empty():
        pool.get_nowait().writer.close()
    return Sample(latency, first_event, elapsed)


# --- orchestration ------------------------------------------------------------------------


def start_process(args: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    # stderr stays on the terminal (errors show); stdout is never read, so not a pipe.
    env = {**os.environ, **(env or {})}
    return subprocess.Popen(args, cwd=ROOT, env=env, stdout=subprocess.DEVNULL)


def wait_http(url: str, timeout_s: float = 60) -> None:
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{url} did not become ready")


def make_key(redis_url: str) -> str:
    from redis.asyncio import Redis

    from gateway.keys import KeyStore

    async def create() -> str:
        redis = Redis.from_url(redis_url)
        store = KeyStore(redis, "default")
        if await store.get_org("bench") is None:
            await store.create_org("bench")
        token, _ = await store.create_key("bench")
        await redis.aclose()  # type: ignore[attr-defined]
        return token

    return asyncio.run(create())


def ms(value: float) -> str:
    return f"{value * 1000:7.2f}"


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def compare(
    label: str,
    direct: Callable[[], Awaitable[Sample]],
    via_gateway: Callable[[], Awaitable[Sample]],
    streaming: bool,
    gateway_pid: int,
) -> None:
    d = await direct()
    cpu_before = cpu_seconds(gateway_pid)
    g = await via_gateway()
    gateway_cpu_us = (cpu_seconds(gateway_pid) - cpu_before) / len(g.latency) * 1e6
    print(f"\n{label}")
    print(
        f"  {'':9}{'n':>7}{'req/s':>9}{'p50 ms':>9}{'p99 ms':>9}"
        + ("  first-event p50/p99 ms" if streaming else "")
    )
    for name, s in (("direct", d), ("gateway", g)):
        extra = (
            f"  {ms(percentile(s.first_event, 0.5))} / {ms(percentile(s.first_event, 0.99))}"
            if streaming
            else ""
        )
        print(
            f"  {name:9}{len(s.latency):7d}{s.throughput:9.1f}"
            f"{ms(percentile(s.latency, 0.5)):>9}{ms(percentile(s.latency, 0.99)):>9}{extra}"
        )
    print(
        f"  added p50 {ms(percentile(g.latency, 0.5) - percentile(d.latency, 0.5))} ms, "
        f"added p99 {ms(percentile(g.latency, 0.99) - percentile(d.latency, 0.99))} ms, "
        f"throughput ratio {g.throughput / d.throughput:.2f}x, "
        f"gateway CPU {gateway_cpu_us:.0f} us/request"
    )


async def benchmark(
    args: argparse.Namespace, key: str, upstream_port: int, gateway_port: int, gateway_pid: int
) -> None:
    # Closed loop at the concurrency that makes the direct path run at --rate.
    closed_concurrency = max(1, round(args.rate * args.upstream_delay_ms / 1000))
    for streaming in (False, True):
        body = {**CHAT_BODY, "stream": True} if streaming else CHAT_BODY
        direct = build_request(upstream_port, "/v1/chat/completions", body, None)
        via = build_request(gateway_port, "/v1/chat/completions", body, key)
        kind = "stream" if streaming else "non-stream"
        # Warm both paths (connections, key cache, code paths).
        await run_load(upstream_port, direct, 8, 1.0, None)
        await run_load(gateway_port, via, 8, 1.0, None)
        await compare(
            f"{kind}, paced at {args.rate:g} req/s for {args.seconds:g} s",
            partial(run_load, upstream_port, direct, args.concurrency, args.seconds, args.rate),
            partial(run_load, gateway_port, via, args.concurrency, args.seconds, args.rate),
            streaming,
            gateway_pid,
        )
        await compare(
            f"{kind}, closed loop at concurrency {closed_concurrency} for {args.seconds:g} s",
            partial(run_load, upstream_port, direct, closed_concurrency, args.seconds, None),
            partial(run_load, gateway_port, via, closed_concurrency, args.seconds, None),
            streaming,
            gateway_pid,
        )


async def vllm_ttft(
    args: argparse.Namespace, key: str, gateway_port: int, gateway_pid: int
) -> None:
    from urllib.parse import urlparse

    vllm_port = urlparse(args.vllm_url).port or 80
    body = {**CHAT_BODY, "stream": True, "max_tokens": 4}
    direct = build_request(vllm_port, "/v1/chat/completions", body, None)
    via = build_request(gateway_port, "/v1/chat/completions", body, key)
    for request, port in ((direct, vllm_port), (via, gateway_port)):
        await run_load(port, request, 1, 1.0, None)
    await compare(
        f"real vLLM ({args.vllm_url}), streams of 4 tokens, concurrency 2, "
        f"{args.vllm_seconds:g} s each",
        partial(run_load, vllm_port, direct, 2, args.vllm_seconds, None),
        partial(run_load, gateway_port, via, 2, args.vllm_seconds, None),
        True,
        gateway_pid,
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rate", type=float, default=500.0)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--concurrency", type=int, default=64, help="most in flight when paced")
    parser.add_argument(
        "--upstream-delay-ms", type=float, default=20.0, help="the fast upstream's answer time"
    )
    parser.add_argument("--vllm-url", default="", help="also measure TTFT overhead on a real vLLM")
    parser.add_argument("--vllm-seconds", type=float, default=15.0)
    parser.add_argument("--serve-upstream", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_upstream:
        run_event_loop(serve_upstream(args.serve_upstream, args.upstream_delay_ms / 1000))
        return

    # Here, not at the top: the upstream process (above) imports nothing of the project.
    from serving.process import free_port
    from serving.valkey import start_valkey

    valkey = start_valkey()
    processes: list[subprocess.Popen[bytes]] = []
    try:
        upstream_port, gateway_port = free_port(), free_port()
        delay = str(args.upstream_delay_ms)
        upstream = [sys.executable, __file__, "--serve-upstream", str(upstream_port)]
        processes.append(start_process([*upstream, "--upstream-delay-ms", delay]))
        wait_http(f"http://127.0.0.1:{upstream_port}/health")
        env = {
            "CSTACK_REDIS_URL": str(valkey.connection_url),
            "CSTACK_UPSTREAM_URL": f"http://127.0.0.1:{upstream_port}",
            "CSTACK_LOG_LEVEL": "warning",
            # The relay's own overhead: no metering (billing's admission has its own
            # benchmark, bench/metering.py) and so no per-key rate limits in the way.
            "CSTACK_BILLING": "false",
            # The stand-in upstream is no engine with a batch size: holding it to the cpu
            # profile's 8 slots would measure the queue, not the relay.
            "CSTACK_ENGINE_ADMISSION": "false",
        }
        processes.append(start_gateway(gateway_port, env))
        key = make_key(str(valkey.connection_url))
        load = os.getloadavg()[0]
        print(f"gateway overhead benchmark: {os.cpu_count()} CPUs, load avg {load:.1f}")
        run_event_loop(benchmark(args, key, upstream_port, gateway_port, processes[-1].pid))
        if args.vllm_url:
            processes[-1].terminate()
            processes[-1].wait()
            processes.append(
                start_gateway(gateway_port, {**env, "CSTACK_UPSTREAM_URL": args.vllm_url})
            )
            run_event_loop(vllm_ttft(args, key, gateway_port, processes[-1].pid))
    finally:
        for process in processes:
            process.terminate()
            process.wait(timeout=10)
        valkey.stop()


def start_gateway(port: int, env: dict[str, str]) -> subprocess.Popen[bytes]:
    """The real `cstack gateway` process, with billing and engine admission off (see the
    module docstring)."""
    from serving.process import free_port

    command = [sys.executable, "-m", "deploy.cli", "gateway", "--port", str(port)]
    process = start_process([*command, "--internal-port", str(free_port())], env)
    wait_http(f"http://127.0.0.1:{port}/readyz")
    return process


def run_event_loop(main_coroutine: Awaitable[None]) -> None:
    try:
        import uvloop

        uvloop.run(main_coroutine)  # type: ignore[arg-type]
    except ImportError:
        asyncio.run(main_coroutine)  # type: ignore[arg-type]


if __name__ == "__main__":
    main()
