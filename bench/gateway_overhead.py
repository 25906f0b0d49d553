"""What the gateway costs: the same load straight to an upstream, through `cstack gateway` as
production runs it, and through the peers (vLLM's router, TensorZero, LiteLLM), in one run.

One run starts a fast OpenAI-speaking upstream (`bench/stand_in_upstream.py`, its own
process answering canned completions and SSE streams), an embedded Valkey (the product's
default Redis, with its password) and, in front of that one upstream, side by side:

- `cstack gateway` as production runs it: billing on (the real meter: admission and rate
  limits in Redis, usage events into the Redis stream that the billing worker writes to the
  ledger), default settings, one worker. This is the headline row;
- the same with billing off (`CSTACK_BILLING=false`), labelled: the relay's own cost;
- the same as the headline with `--workers 2` (left out with `--no-workers-row`);
- with `--baseline-tree DIR`, the headline's configuration run from another checkout of the
  project (e.g. `git worktree add DIR REV`), with this venv: one build against another in
  the same run;
- with `--litellm PATH`, LiteLLM's proxy (`litellm[proxy]==1.100.0` in a venv of its own:
  `python3 -m venv /tmp/litellm-venv && /tmp/litellm-venv/bin/pip install
  'litellm[proxy]==1.100.0'`), no database, one worker, a master key;
- with `--vllm-router PATH`, vLLM's router (`vllm-router==0.1.17`, Rust, in a venv of its
  own), round robin over the one upstream, no auth and no metering at all;
- with `--tensorzero PYTHON`, TensorZero's gateway (`tensorzero==2026.6.0`, Rust inside
  its wheel), no auth, metering or observability; it refuses `n` other than 1, so its
  varied requests have n = 1 (its rows say so). `bench/peers.py` starts the peers and
  says how to install them;
- with `--framework-floor`, uvicorn serving a trivial app (`bench/framework_floor.py`): what
  the server framework alone costs a request, before any of the gateway's work.

Every gateway runs with engine admission off (`CSTACK_ENGINE_ADMISSION=false`): the
stand-in upstream is no engine with a batch size, and holding it to the cpu profile's 8
slots would measure the queue, not the gateway. The ledger (`--ledger-url`; a SQLite file
in a temp dir by default, `cstack up`'s default) is off the request path: the billing
worker writes it from the stream in production, in pods of its own, so it is not run here.
Keys belong to a plan whose limits never bind (`bench`, added to the shipped price book).

Then it sends requests to each, one after the other: first varied shapes, the headline
(VARIED_BODIES chat completions, each its own prompt size, `max_tokens` and `n`, from the
keys of --tenants orgs in turn), then one repeated shape (`max_tokens` 8) as an extra
table. The upstream answers every one alike (8 tokens, one choice; a stream in the events
vLLM sends for the body it gets: a token an event, or `stream_interval` of them (2 events
for the gateway's whole answers, 16 a chunk), between the role's event and the usage's):
what varies is what the gateway reads, reserves and settles.

1. throughput: a closed loop of --clients clients (keep-alive connections), the upstream
   answering at once, for --seconds, --rounds times round-robin over the targets: req/s,
   p50/p99 latency, and the CPU per request of the target's processes (all of them).
   "vs billing off, paired" is the median over rounds of a target's req/s divided by
   billing off's in the same round: a shared machine's speed drifts by up to 2x from one
   minute to the next (seen here), which a ratio of best rounds takes in whole and a ratio
   of rounds taken moments apart mostly cancels. Many short rounds (`--rounds 16
   --seconds 1.5`) narrow it further;
2. added latency: paced at --rate requests/s (open loop, latency counted from the scheduled
   send time so queueing counts), the upstream answering in --upstream-delay-ms: p50/p99 and
   what each adds to the direct path's. A target whose throughput in part 1 was under the
   rate is left out (it would only measure its queue). `--throughput-only` skips it (for
   an A/B of two builds: more rounds in the same time).

With `--pin` (two CPUs or more) every one-worker gateway (and LiteLLM) runs on the first
CPU and the load generator, the upstream and Valkey on the others, as a gateway pod would
have its core to itself; the `--workers 2` gateway keeps every CPU. Unpinned, all of them
share the machine's cores as the scheduler sees fit: a gateway waiting on Valkey or the
load generator then shows as lower throughput, not as CPU.

With --vllm-url it also compares time-to-first-token against a real vLLM at low load,
through the headline gateway.

    .venv/bin/python bench/gateway_overhead.py [--litellm /tmp/litellm-venv/bin/litellm]
        [--seconds 10] [--rounds 2] [--clients 8] [--rate 300] [--vllm-url URL]
        [--baseline-tree DIR] [--no-workers-row] [--throughput-only] [--pin]
        [--framework-floor]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import math
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from peers import (
    LITELLM_KEY,
    TENSORZERO_MODEL,
    TENSORZERO_PATH,
    start_litellm,
    start_process,
    start_tensorzero,
    start_vllm_router,
    wait_http,
)
from stand_in_upstream import set_upstream_delay

ROOT = Path(__file__).resolve().parents[1]
STAND_IN_UPSTREAM = Path(__file__).with_name("stand_in_upstream.py")
FRAMEWORK_FLOOR = Path(__file__).with_name("framework_floor.py")
CHAT_BODY = {
    "model": "composer-2.5",
    "messages": [{"role": "user", "content": "hi"}],
    "max_tokens": 8,
}
#: Varied traffic: this many bodies, each its own prompt size (5-1,500 words), max_tokens
#: (4-4,096), both log-uniform, and n (1 or 2), sent in turn by keys of --tenants orgs.
VARIED_BODIES = 512
WORDS = [
    "the",
    "gateway",
    "meters",
    "every",
    "token",
    "of",
    "each",
    "request",
    "and",
    "bills",
    "its",
    "org",
    "fairly",
]
#: A plan whose limits never bind: the benchmark measures the meter, not its refusals.
BENCH_PLAN = {
    "included_usd": "1000000.00",
    "overage": "refused",
    "rpm": 1_000_000_000,
    "tpm": 1_000_000_000_000,
}


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
    port: int, requests: list[bytes], concurrency: int, seconds: float, rate: float | None
) -> Sample:
    """Closed loop when ``rate`` is None, else paced at ``rate`` requests/s (open loop);
    ``requests`` are sent in turn."""
    pool = await connect_pool(port, concurrency)
    turn = itertools.cycle(requests)
    latency: list[float] = []
    first_event: list[float] = []

    async def one(scheduled: float) -> None:
        connection = await pool.get()
        try:
            sent = time.perf_counter()
            first = await connection.exchange(next(turn))
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


# --- the targets ------------------------------------------------------------------------


@dataclass
class Target:
    """Something the load goes to: its name in the tables, its port, the key it wants, and
    the processes whose CPU it spends (empty for the direct path: the upstream's is not
    the gateway's)."""

    name: str
    port: int
    #: The keys its requests carry, in turn (none: it asks for none).
    keys: list[str]
    pids: list[int] = field(default_factory=list)
    #: The Redis it meters through (its CPU is shown apart: production runs it elsewhere).
    redis_pids: list[int] = field(default_factory=list)
    #: The paths its requests go to (LiteLLM's proxy serves the same /v1 routes).
    path: str = "/v1/chat/completions"
    #: The model name it wants, when not ours.
    model: str | None = None
    #: It refuses ``n`` other than 1 (TensorZero): its varied bodies have n = 1.
    single_choice: bool = False

    def requests(self, bodies: list[dict[str, Any]]) -> list[bytes]:
        made = []
        for index, body in enumerate(bodies):
            body = {**body, **({"model": self.model} if self.model else {})}
            if self.single_choice:
                body.pop("n", None)
            key = self.keys[index % len(self.keys)] if self.keys else None
            made.append(build_request(self.port, self.path, body, key))
        return made

    def cpu_seconds(self, redis: bool = False) -> float:
        """User + system CPU time so far of its processes and their children (or Redis)."""
        import psutil

        total = 0.0
        for pid in self.redis_pids if redis else self.pids:
            try:
                process = psutil.Process(pid)
                for each in [process, *process.children(recursive=True)]:
                    times = each.cpu_times()
                    total += times.user + times.system
            except psutil.NoSuchProcess:
                continue
        return total


def make_keys(redis_url: str, plan: str, tenants: int) -> list[str]:
    """A key of each of ``tenants`` orgs on ``plan``."""
    from redis.asyncio import Redis

    from gateway.access.keys import KeyStore

    async def create() -> list[str]:
        redis = Redis.from_url(redis_url)
        store = KeyStore(redis, "default")
        tokens = []
        for tenant in range(tenants):
            org = f"bench-{tenant}"
            if await store.get_org(org) is None:
                await store.create_org(org, plan=plan)
            tokens.append((await store.create_key(org, plan=plan))[0])
        await redis.aclose()  # type: ignore[attr-defined]
        return tokens

    return asyncio.run(create())


def varied_bodies(stream: bool, seed: int = 0) -> list[dict[str, Any]]:
    """VARIED_BODIES chat requests of varied shapes (the same ones in every run)."""
    rng = random.Random(seed)

    def log_uniform(low: int, high: int) -> int:
        return int(math.exp(rng.uniform(math.log(low), math.log(high))))

    bodies = []
    for _ in range(VARIED_BODIES):
        words = " ".join(rng.choice(WORDS) for _ in range(log_uniform(5, 1500)))
        body: dict[str, Any] = {
            "model": "composer-2.5",
            "messages": [{"role": "user", "content": words}],
            "max_tokens": log_uniform(4, 4096),
            "n": rng.randint(1, 2),
        }
        bodies.append({**body, "stream": True} if stream else body)
    return bodies


def one_shape(stream: bool) -> list[dict[str, Any]]:
    return [{**CHAT_BODY, "stream": True} if stream else CHAT_BODY]


def write_price_book(directory: Path) -> Path:
    """The shipped price book plus the ``bench`` plan."""
    import yaml

    from billing.settings import DEFAULT_PRICEBOOK_PATH

    book = yaml.safe_load(DEFAULT_PRICEBOOK_PATH.read_text())
    book["plans"]["bench"] = BENCH_PLAN
    path = directory / "pricebook.yaml"
    path.write_text(yaml.safe_dump(book))
    return path


def start_gateway(
    port: int, env: dict[str, str | None], workers: int, log: Path, tree: Path = ROOT
) -> subprocess.Popen[bytes]:
    """The real `cstack gateway` process (its own process group, like a container's), of
    the checkout at ``tree``."""
    from serving.process import free_port

    command = [sys.executable, "-m", "deploy.cli", "gateway", "--port", str(port)]
    command += ["--internal-port", str(free_port()), "--workers", str(workers)]
    if tree != ROOT:  # its own code first, ahead of this checkout's editable install
        env = {**env, "PYTHONPATH": str(tree)}
    process = start_process(command, env, log, cwd=tree)
    wait_http(f"http://127.0.0.1:{port}/readyz", process)
    return process


# --- measuring ----------------------------------------------------------------------------


def ms(value: float) -> str:
    return f"{value * 1000:.2f}"


@dataclass
class Measured:
    sample: Sample
    #: CPU per request of the target's processes, and of its Redis.
    cpu_us: float
    redis_us: float


async def measure(target: Target, bodies: list[dict[str, Any]], concurrency: int,
                  seconds: float, rate: float | None) -> Measured:  # fmt: skip
    requests = target.requests(bodies)
    before, redis_before = target.cpu_seconds(), target.cpu_seconds(redis=True)
    sample = await run_load(target.port, requests, concurrency, seconds, rate)
    count = max(1, len(sample.latency))
    cpu = (target.cpu_seconds() - before) / count * 1e6
    return Measured(sample, cpu, (target.cpu_seconds(redis=True) - redis_before) / count * 1e6)


async def warm(targets: list[Target], bodies: list[dict[str, Any]]) -> None:
    for target in targets:
        await measure(target, bodies, 8, 1.0, None)


async def throughput(
    args: argparse.Namespace, targets: list[Target], upstream_port: int
) -> dict[str, float]:
    """Part 1, varied shapes first (the headline), then one repeated shape; returns each
    target's best non-streaming req/s on the one shape (part 2 sends that shape)."""
    await set_upstream_delay(upstream_port, 0)
    best: dict[str, float] = {}
    for (shapes, make), streaming in itertools.product(
        (("varied shapes", varied_bodies), ("one shape", one_shape)), (False, True)
    ):
        bodies = make(streaming)
        await warm(targets, bodies)
        runs: dict[str, list[Measured]] = {t.name: [] for t in targets}
        for _ in range(args.rounds):
            for target in targets:
                runs[target.name].append(
                    await measure(target, bodies, args.clients, args.seconds, None)
                )
        kind = "streams (whole stream)" if streaming else "non-streaming"
        tenants = f"{args.tenants} orgs' keys in turn" if shapes == "varied shapes" else "one key"
        print(
            f"\n1. throughput, {shapes}, {kind}, {tenants}: closed loop, {args.clients} clients, "
            "upstream answering "
            f"at once, {args.rounds} x {args.seconds:g} s per target (load avg at the end "
            f"{os.getloadavg()[0]:.1f})"
        )
        direct = max(m.sample.throughput for m in runs["direct"])
        headline = max(m.sample.throughput for m in runs[HEADLINE])
        print(
            "| target | req/s | vs direct | vs billing on | vs billing off, paired | p50 ms "
            "| p99 ms | CPU / request | Redis CPU / request |"
        )
        print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
        for target in targets:
            measured = runs[target.name]
            rates = [m.sample.throughput for m in measured]
            top = max(rates)
            if not streaming and shapes == "one shape":
                best[target.name] = top
            spread = f"{min(rates):.0f}-{top:.0f}" if len(rates) > 1 else f"{top:.0f}"
            p50 = per_round([percentile(m.sample.latency, 0.5) * 1000 for m in measured], "")
            p99 = per_round([percentile(m.sample.latency, 0.99) * 1000 for m in measured], "")
            cpu = per_round([m.cpu_us for m in measured], " us") if target.pids else "-"
            redis = per_round([m.redis_us for m in measured], " us") if target.redis_pids else "-"
            paired = paired_ratio(measured, runs[BILLING_OFF])
            print(
                f"| {target.name} | {spread} | {top / direct:.2f}x | {top / headline:.2f}x "
                f"| {paired:.2f}x | {p50} | {p99} | {cpu} | {redis} |"
            )
    return best


def per_round(values: list[float], unit: str) -> str:
    """Each round's value (up to 4 rounds), else their range and median."""
    digits = 0 if unit else 2
    if len(values) <= 4:
        return "/".join(f"{v:.{digits}f}" for v in values) + unit
    middle = statistics.median(values)
    return f"{min(values):.{digits}f}-{max(values):.{digits}f}{unit} (median {middle:.{digits}f})"


def paired_ratio(measured: list[Measured], reference: list[Measured]) -> float:
    """The median over rounds of ``measured``'s req/s over ``reference``'s in the same round."""
    return statistics.median(
        m.sample.throughput / max(r.sample.throughput, 1e-9)
        for m, r in zip(measured, reference, strict=True)
    )


async def added_latency(
    args: argparse.Namespace, targets: list[Target], upstream_port: int, best: dict[str, float]
) -> None:
    """Part 2."""
    await set_upstream_delay(upstream_port, args.upstream_delay_ms)
    fast_enough = [t for t in targets if best[t.name] >= args.rate]
    for target in targets:
        if target not in fast_enough:
            print(
                f"\n(part 2 leaves out {target.name}: {best[target.name]:.0f} req/s at most in "
                f"part 1, under the rate)"
            )
    for streaming in (False, True):
        bodies = one_shape(streaming)
        await warm(fast_enough, bodies)
        kind = "streams" if streaming else "non-streaming"
        print(
            f"\n2. added latency, {kind}: paced at {args.rate:g} req/s for {args.seconds:g} s, "
            f"upstream answering in {args.upstream_delay_ms:g} ms"
            + (" (first event / whole stream)" if streaming else "")
            + f" (load avg at the start {os.getloadavg()[0]:.1f})"
        )
        print(
            "| target | p50 ms | p99 ms | added p50 / p99 ms | throughput ratio | CPU / request |"
        )
        print("| --- | --- | --- | --- | --- | --- |")
        results = {
            t.name: await measure(t, bodies, args.concurrency, args.seconds, args.rate)
            for t in fast_enough
        }
        direct = results["direct"].sample
        for target in fast_enough:
            s = results[target.name].sample
            p50, p99 = percentile(s.latency, 0.5), percentile(s.latency, 0.99)
            shown = f"{ms(p50)} | {ms(p99)}"
            if streaming:
                first50, first99 = percentile(s.first_event, 0.5), percentile(s.first_event, 0.99)
                shown = f"{ms(first50)} / {ms(p50)} | {ms(first99)} / {ms(p99)}"
            added = (
                "-"
                if target.name == "direct"
                else f"{ms(p50 - percentile(direct.latency, 0.5))} / "
                f"{ms(p99 - percentile(direct.latency, 0.99))}"
            )
            cpu = f"{results[target.name].cpu_us:.0f} us" if target.pids else "-"
            print(
                f"| {target.name} | {shown} | {added} | "
                f"{s.throughput / direct.throughput:.2f}x | {cpu} |"
            )


async def vllm_ttft(args: argparse.Namespace, gateway: Target) -> None:
    from urllib.parse import urlparse

    vllm = Target("vLLM direct", urlparse(args.vllm_url).port or 80, [])
    bodies = [{**CHAT_BODY, "stream": True, "max_tokens": 4}]
    await warm([vllm, gateway], bodies)
    print(
        f"\nreal vLLM ({args.vllm_url}), streams of 4 tokens, concurrency 2, "
        f"{args.vllm_seconds:g} s each (first token p50 / p99 ms, whole stream p50 / p99 ms)"
    )
    for target in (vllm, gateway):
        s = (await measure(target, bodies, 2, args.vllm_seconds, None)).sample
        print(
            f"  {target.name}: {ms(percentile(s.first_event, 0.5))} / "
            f"{ms(percentile(s.first_event, 0.99))}, {ms(percentile(s.latency, 0.5))} / "
            f"{ms(percentile(s.latency, 0.99))}, {s.throughput:.1f} req/s"
        )


# --- orchestration ------------------------------------------------------------------------

HEADLINE = "gateway, billing on (production default)"
BILLING_OFF = "gateway, billing off"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=10.0, help="per measurement")
    parser.add_argument("--rounds", type=int, default=2, help="throughput rounds per target")
    parser.add_argument("--clients", type=int, default=8, help="closed-loop clients (part 1)")
    parser.add_argument("--rate", type=float, default=300.0, help="paced rate (part 2)")
    parser.add_argument("--concurrency", type=int, default=64, help="most in flight when paced")
    parser.add_argument(
        "--upstream-delay-ms", type=float, default=20.0, help="the upstream's answer time, part 2"
    )
    parser.add_argument("--litellm", default="", help="LiteLLM's `litellm` executable")
    parser.add_argument("--vllm-router", default="", help="vLLM's `vllm-router` executable")
    parser.add_argument(
        "--tensorzero", default="", help="the Python of a venv with tensorzero==2026.6.0"
    )
    parser.add_argument("--tenants", type=int, default=4, help="orgs sending varied shapes")
    parser.add_argument(
        "--baseline-tree",
        default="",
        help="another checkout of the project: its gateway, billing on, as a row of its own",
    )
    parser.add_argument("--ledger-url", default="", help="the ledger (default: SQLite, temp)")
    parser.add_argument("--vllm-url", default="", help="also measure TTFT overhead on a real vLLM")
    parser.add_argument("--vllm-seconds", type=float, default=15.0)
    parser.add_argument(
        "--no-workers-row", action="store_true", help="leave out the `--workers 2` row"
    )
    parser.add_argument(
        "--throughput-only", action="store_true", help="skip part 2 (the paced latency)"
    )
    parser.add_argument(
        "--framework-floor",
        action="store_true",
        help="add uvicorn serving a trivial app (bench/framework_floor.py): the framework's cost",
    )
    parser.add_argument(
        "--pin",
        action="store_true",
        help="one-worker gateways on one CPU, the rest on the others (as in a pod)",
    )
    args = parser.parse_args()
    litellm = shutil.which(args.litellm) if args.litellm else None
    if args.litellm and litellm is None:
        parser.error(f"--litellm {args.litellm}: no such executable")
    baseline = Path(args.baseline_tree).resolve() if args.baseline_tree else None
    if baseline is not None and not (baseline / "deploy" / "cli.py").is_file():
        parser.error(f"--baseline-tree {args.baseline_tree}: not a checkout of this project")
    if args.pin and len(os.sched_getaffinity(0)) < 2:
        parser.error("--pin needs two CPUs or more")

    # Here, not at the top: the upstream process (above) imports nothing of the project.
    from serving.process import free_port
    from serving.valkey import start_valkey

    work = Path(tempfile.mkdtemp(prefix="cstack-bench-"))
    valkey = start_valkey()
    processes: list[subprocess.Popen[bytes]] = []
    try:
        redis_url = str(valkey.connection_url)
        upstream_port = free_port()
        upstream = [sys.executable, str(STAND_IN_UPSTREAM), str(upstream_port)]
        processes.append(start_process(upstream))
        wait_http(f"http://127.0.0.1:{upstream_port}/health", processes[-1])
        billed = {
            "CSTACK_REDIS_URL": redis_url,
            "CSTACK_UPSTREAM_URL": f"http://127.0.0.1:{upstream_port}",
            "CSTACK_LOG_LEVEL": "warning",
            # The stand-in upstream is no engine with a batch size: holding it to the cpu
            # profile's 8 slots would measure the queue, not the gateway.
            "CSTACK_ENGINE_ADMISSION": "false",
            "CSTACK_PRICEBOOK_PATH": str(write_price_book(work)),
            "CSTACK_LEDGER_URL": args.ledger_url or f"sqlite:///{work / 'ledger.db'}",
            "CSTACK_USAGE_SPOOL_DIR": str(work / "spool"),
        }
        configurations = [
            (HEADLINE, billed, 1, ROOT),
            (BILLING_OFF, {**billed, "CSTACK_BILLING": "false"}, 1, ROOT),
        ]
        if not args.no_workers_row:
            configurations.append(("gateway, billing on, --workers 2", billed, 2, ROOT))
        if baseline is not None:
            configurations.append(
                (f"gateway, billing on, build at {baseline.name}", billed, 1, baseline)
            )
        keys = make_keys(redis_url, "bench", args.tenants)
        targets = [Target("direct", upstream_port, [])]
        one_worker: list[int] = []  # the processes of the one-worker gateways
        for name, env, workers, tree in configurations:
            port = free_port()
            processes.append(start_gateway(port, env, workers, work / "gateway.log", tree))
            redis_pids = [valkey._process.pid] if env is billed else []
            targets.append(Target(name, port, keys, [processes[-1].pid], redis_pids))
            if workers == 1:
                one_worker.append(processes[-1].pid)
        if litellm:
            port = free_port()
            processes.append(start_litellm(litellm, port, upstream_port, work))
            targets.append(
                Target("LiteLLM 1.100.0 proxy, 1 worker, no database", port, [LITELLM_KEY],
                       [processes[-1].pid])
            )  # fmt: skip
            one_worker.append(processes[-1].pid)
        else:
            print("LiteLLM column skipped: no --litellm (see the module docstring to install it)")
        if args.vllm_router:
            port = free_port()
            processes.append(start_vllm_router(args.vllm_router, port, upstream_port, work))
            targets.append(
                Target("vllm-router 0.1.17, round robin, no auth or metering", port, [],
                       [processes[-1].pid])
            )  # fmt: skip
            one_worker.append(processes[-1].pid)
        if args.tensorzero:
            process, port = start_tensorzero(args.tensorzero, upstream_port, work)
            processes.append(process)
            targets.append(
                Target("TensorZero 2026.6.0, no auth, metering or observability", port, [],
                       [process.pid], path=TENSORZERO_PATH, model=TENSORZERO_MODEL,
                       single_choice=True)
            )  # fmt: skip
            one_worker.append(process.pid)
        if args.framework_floor:
            port = free_port()
            processes.append(start_process([sys.executable, str(FRAMEWORK_FLOOR), str(port)]))
            wait_http(f"http://127.0.0.1:{port}/", processes[-1])
            targets.append(
                Target("EXTRA: uvicorn and a trivial app (the server framework alone)", port,
                       [], [processes[-1].pid])
            )  # fmt: skip
            one_worker.append(processes[-1].pid)
        if args.pin:
            cpus = sorted(os.sched_getaffinity(0))
            pin(one_worker, set(cpus[:1]))
            # This process's own threads only: its children are the gateways just pinned.
            pin([os.getpid()], set(cpus[1:]), children=False)
            pin([processes[0].pid, valkey._process.pid], set(cpus[1:]))
            print(f"pinned: one-worker gateways on CPU {cpus[0]}, the load generator, the "
                  f"upstream and Valkey on CPUs {cpus[1:]}")  # fmt: skip
        load = os.getloadavg()[0]
        print(f"gateway overhead benchmark: {os.cpu_count()} CPUs, load avg {load:.1f}")
        best = run_until_done(throughput(args, targets, upstream_port))
        if not args.throughput_only:
            run_event_loop(added_latency(args, targets, upstream_port, best))
        if args.vllm_url:
            port = free_port()
            # A real engine: admission on, as production runs it.
            env = {**billed, "CSTACK_UPSTREAM_URL": args.vllm_url, "CSTACK_ENGINE_ADMISSION": None}
            processes.append(start_gateway(port, env, 1, work / "gateway.log"))
            run_event_loop(vllm_ttft(args, Target(HEADLINE, port, keys, [processes[-1].pid])))
        print(f"\nload avg at the end {os.getloadavg()[0]:.1f}")
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
        valkey.stop()
        shutil.rmtree(work, ignore_errors=True)


def pin(pids: list[int], cpus: set[int], children: bool = True) -> None:
    """Hold processes to ``cpus``: every thread of each, and of their children unless
    ``children`` is false (threads made later inherit it from the thread that makes them)."""
    import psutil

    for pid in pids:
        try:
            root = psutil.Process(pid)
            for process in [root, *(root.children(recursive=True) if children else [])]:
                for thread in process.threads():
                    os.sched_setaffinity(thread.id, cpus)
        except (psutil.NoSuchProcess, ProcessLookupError):
            continue


def run_until_done(main_coroutine: Awaitable[dict[str, float]]) -> dict[str, float]:
    result: dict[str, float] = {}

    async def keep() -> None:
        result.update(await main_coroutine)

    run_event_loop(keep())
    return result


def run_event_loop(main_coroutine: Awaitable[None]) -> None:
    try:
        import uvloop

        uvloop.run(main_coroutine)  # type: ignore[arg-type]
    except ImportError:
        asyncio.run(main_coroutine)  # type: ignore[arg-type]


if __name__ == "__main__":
    main()
