"""The fast tier's promise under load: real vLLM, both tiers on one engine, mixed load.

    python bench/tiers.py [--probes 12] [--load-clients 16] [--load-tokens 256] [--no-sweep]
        [--sweep-only] [--load-unstreamed]

Starts what `cstack up` runs (the tiny checkpoint on vLLM's shared variant, an
authenticated Valkey, `cstack gateway` with billing on) and measures, through the gateway:

1. fast alone: time to first token (TTFT) and inter-token latency (ITL) of a sequential
   probe;
2. the fast probe while standard load at twice the engine's batch size runs (closed loop,
   from a process of its own: in the probe's event loop, the load's streams would delay the
   reading of the probe's first token and the benchmark would measure its own client);
3. a standard probe while fast load saturates the engine;
4. goodput per tier (completion tokens/s) during 2 and 3.

The headline is the production configuration (tier-aware engine admission on); the same
scenarios with ``CSTACK_ENGINE_ADMISSION=false`` (vLLM's priority scheduling alone) are
the labelled extra rows, from the same run. Then a sweep, admission on, so that no single
workload hides a slow tier: for a short and a ~400-token prompt, fast probes of 32 tokens
alone and under standard load of 12 and 16 clients of 64 and 256 tokens, and standard
probes under the same fast loads; it ends with the worst ratio and the worst p99. The sweep
runs with standard streaming 8 tokens a chunk (the shared variant's ``tier_stream_interval``,
production) and, as the labelled extra, every token. With ``--load-unstreamed`` the load's
clients ask for whole answers, which vLLM sends the gateway 16 tokens a chunk in both modes
(``gateway.api.shaping.UNSTREAMED_STREAM_INTERVAL``); the modes then differ in the standard
probes only.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import multiprocessing
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml
from billed_stack import billed_gateway, tiny_engine

from serving.settings import DEFAULT_VARIANTS_FILE

PROMPT = [{"role": "user", "content": "Write a long story about a lighthouse keeper."}]
#: About 400 prompt tokens: an agent's turn with some context, for the sweep.
LONG_PROMPT = [
    {
        "role": "user",
        "content": "Here is the log of the last deployment:\n"
        + "\n".join(f"step {i}: replica {i % 7} healthy, 12 ms, no retries" for i in range(40))
        + "\nSummarise what happened.",
    }
]


@dataclass
class Probe:
    ttft_s: list[float] = field(default_factory=list)
    itl_s: list[float] = field(default_factory=list)
    errors: int = 0


@dataclass
class Load:
    tokens: int = 0
    errors: int = 0


def quantile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def completion_body(
    tier: str, max_tokens: int, messages: list[dict[str, str]]
) -> dict[str, object]:
    """A chat completion of ``tier`` that generates all ``max_tokens``."""
    return {
        "model": f"composer-2.5-{tier}",
        "messages": messages,
        "max_tokens": max_tokens,
        "ignore_eos": True,
    }


async def stream_once(
    client: httpx.AsyncClient, tier: str, max_tokens: int, messages: list[dict[str, str]] = PROMPT
) -> tuple[float, list[float], int]:
    """(TTFT, gaps between content chunks, completion tokens) of one streamed completion
    (a chunk may carry several tokens: the tokens come from the stream's usage)."""
    body = {
        **completion_body(tier, max_tokens, messages),
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    started = time.perf_counter()
    stamps: list[float] = []
    tokens = 0
    async with client.stream("POST", "/v1/chat/completions", json=body) as response:
        if response.status_code != 200:
            await response.aread()
            raise RuntimeError(f"{response.status_code}: {response.text[:200]}")
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            try:
                chunk = json.loads(line[6:])
            except json.JSONDecodeError:
                raise RuntimeError(f"a broken event ({len(line)} bytes): {line[-120:]!r}") from None
            if chunk.get("choices") and chunk["choices"][0]["delta"].get("content"):
                stamps.append(time.perf_counter())
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
    if not stamps:
        raise RuntimeError("no content")
    gaps = [b - a for a, b in itertools.pairwise(stamps)]
    return stamps[0] - started, gaps, tokens


async def complete_once(
    client: httpx.AsyncClient, tier: str, max_tokens: int, messages: list[dict[str, str]] = PROMPT
) -> int:
    """The completion tokens of one unstreamed completion (``--load-unstreamed``)."""
    body = completion_body(tier, max_tokens, messages)
    response = await client.post("/v1/chat/completions", json=body)
    if response.status_code != 200:
        raise RuntimeError(f"{response.status_code}: {response.text[:200]}")
    return int(response.json()["usage"]["completion_tokens"])


async def probe(
    client: httpx.AsyncClient, tier: str, args: argparse.Namespace, result: Probe
) -> None:
    for _ in range(args.probes):
        try:
            ttft, gaps, _ = await stream_once(client, tier, args.probe_tokens, args.messages)
        except (RuntimeError, httpx.HTTPError):
            result.errors += 1
            continue
        result.ttft_s.append(ttft)
        result.itl_s.extend(gaps)


async def load(
    client: httpx.AsyncClient, tier: str, args: argparse.Namespace, result: Load
) -> None:
    while True:
        try:
            if args.load_unstreamed:
                tokens = await complete_once(client, tier, args.load_tokens, args.messages)
            else:
                _, _, tokens = await stream_once(client, tier, args.load_tokens, args.messages)
            result.tokens += tokens
        except (RuntimeError, httpx.HTTPError):
            result.errors += 1
            await asyncio.sleep(0.5)


def load_process(
    url: str, key: str, tier: str, args: argparse.Namespace, counts: Any, stop: Any
) -> None:
    """``args.load_clients`` closed-loop streams of ``tier`` until ``stop`` is set, in a
    process of their own (a customer's load does not share the probe's event loop: there
    it would delay the reading of the probe's first token). ``counts``: tokens, errors."""

    async def main() -> None:
        result = Load()
        limits = httpx.Limits(max_connections=args.load_clients + 4)
        headers = {"authorization": f"Bearer {key}"}
        async with httpx.AsyncClient(
            base_url=url, headers=headers, timeout=300, limits=limits
        ) as client:
            tasks = [
                asyncio.create_task(load(client, tier, args, result))
                for _ in range(args.load_clients)
            ]
            while not stop.is_set():
                counts[0], counts[1] = result.tokens, result.errors
                await asyncio.sleep(0.05)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    asyncio.run(main())


@contextlib.contextmanager
def background_load(
    url: str, key: str, tier: str | None, args: argparse.Namespace
) -> Iterator[Callable[[], Load]]:
    """The loading tier's clients in a spawned process while the block runs; yields a
    function returning the tokens and errors so far (nothing when ``tier`` is None)."""
    if tier is None:
        yield Load
        return
    context = multiprocessing.get_context("spawn")
    counts, stop = context.Array("q", 2, lock=False), context.Event()
    worker = context.Process(
        target=load_process, args=(url, key, tier, args, counts, stop), daemon=True
    )
    worker.start()
    try:
        yield lambda: Load(counts[0], counts[1])
    finally:
        stop.set()
        worker.join(10)
        if worker.is_alive():
            worker.kill()


async def scenario(
    url: str, key: str, probe_tier: str, load_tier: str | None, args: argparse.Namespace
) -> tuple[Probe, Load, float]:
    headers = {"authorization": f"Bearer {key}"}
    with background_load(url, key, load_tier, args) as so_far:
        if load_tier is not None:
            await asyncio.sleep(args.warmup_s)  # the engine fills up
        async with httpx.AsyncClient(base_url=url, headers=headers, timeout=300) as client:
            measured = Probe()
            started, before = time.perf_counter(), so_far()
            await probe(client, probe_tier, args, measured)
            elapsed = time.perf_counter() - started
            after = so_far()
    return measured, Load(after.tokens - before.tokens, after.errors), elapsed


@contextlib.contextmanager
def stack(
    tmp: Path, admission: bool, engine_url: str, engine_key: str, every_token: bool = False
) -> Iterator[str]:
    """`cstack gateway` (billing on) in front of the engine; its URL, with a key made.
    ``every_token``: standard streams every token too (no ``tier_stream_interval``)."""
    env = {
        "CSTACK_UPSTREAM_URL": engine_url,
        "CSTACK_UPSTREAM_API_KEY": engine_key,
        "CSTACK_ENGINE_ADMISSION": str(admission).lower(),
    }
    if every_token:
        raw = yaml.safe_load(DEFAULT_VARIANTS_FILE.read_text())
        raw["variants"]["shared"].pop("tier_stream_interval", None)
        (tmp / "variants-every-token.yaml").write_text(yaml.safe_dump(raw))
        env["CSTACK_VARIANTS_FILE"] = str(tmp / "variants-every-token.yaml")
    with billed_gateway(tmp, f"admission-{admission}-{every_token}", env) as gateway:
        yield f"{gateway.url}|{gateway.key}"


def row(label: str, measured: Probe, goodput: Load, elapsed: float) -> str:
    ttft = [v * 1000 for v in measured.ttft_s]
    itl = [v * 1000 for v in measured.itl_s]
    return (
        f"| {label} | {quantile(ttft, 0.5):.0f} | {quantile(ttft, 0.99):.0f} "
        f"| {quantile(itl, 0.5):.0f} | {quantile(itl, 0.99):.0f} "
        f"| {goodput.tokens / elapsed:.0f} | {measured.errors + goodput.errors} |"
    )


async def run(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="cstack-bench-tiers-") as scratch:
        tmp = Path(scratch)
        with tiny_engine(tmp, args.engine_url) as (engine_url, engine_key):
            if not args.sweep_only:
                print("| scenario | TTFT p50 ms | TTFT p99 ms | ITL p50 ms | ITL p99 ms "
                      "| load goodput tok/s | errors |")  # fmt: skip
                print("| --- | --- | --- | --- | --- | --- | --- |")
                results: dict[tuple[bool, str], float] = {}
                for admission in (True, False):
                    label = "admission on" if admission else "EXTRA: admission off"
                    with stack(tmp, admission, engine_url, engine_key) as target:
                        url, key = target.split("|")
                        await scenario(url, key, "fast", None, argparse.Namespace(
                            **{**vars(args), "probes": 2}))  # fmt: skip  # warm-up
                        for name, probe_tier, load_tier in (
                            ("fast alone", "fast", None),
                            ("fast under standard load", "fast", "standard"),
                            ("standard alone", "standard", None),
                            ("standard under fast load", "standard", "fast"),
                        ):
                            measured, goodput, elapsed = await scenario(
                                url, key, probe_tier, load_tier, args
                            )
                            print(row(f"{label}: {name}", measured, goodput, elapsed), flush=True)
                            results[(admission, name + " p50")] = quantile(measured.ttft_s, 0.5)
                            results[(admission, name + " p99")] = quantile(measured.ttft_s, 0.99)
            if not args.no_sweep:
                print("\n| standard streams | prompt | standard load (clients x tokens) "
                      "| fast alone p50 ms | fast under load p50 ms | ratio "
                      "| standard under fast load p99 s | errors |")  # fmt: skip
                print("| --- | --- | --- | --- | --- | --- | --- | --- |")
                worst = []
                for every_token in (False, True):
                    label = "EXTRA: every token" if every_token else "8 tokens a chunk"
                    with stack(tmp, True, engine_url, engine_key, every_token) as target:
                        url, key = target.split("|")
                        worst.append(f"{label}: " + await sweep(url, key, args, label))
                print("\n".join(worst))
            if not args.sweep_only:
                for admission in (True, False):
                    alone = results[(admission, "fast alone p50")]
                    loaded = results[(admission, "fast under standard load p50")]
                    starved = results[(admission, "standard under fast load p99")]
                    print(
                        f"admission {'on' if admission else 'off'}: fast TTFT p50 under standard "
                        f"load / alone = {loaded / alone:.2f}x (target <= 1.5x); standard TTFT p99 "
                        f"under fast load = {starved:.1f} s (target <= 10 s)"
                    )


#: The sweep's workloads: prompts, the loading tier's output lengths and client counts
#: (1.5x and 2x the engine's batch of 8). No single one may hide a slow fast tier.
SWEEP_PROMPTS = {"short": PROMPT, "~400 tokens": LONG_PROMPT}
SWEEP_LOAD_TOKENS = (64, 256)
SWEEP_LOAD_CLIENTS = (12, 16)


async def sweep(url: str, key: str, args: argparse.Namespace, label: str) -> str:
    """Fast probes of 32 tokens alone and under each standard load, and standard probes
    under each fast load, for each prompt: prints a table row each; returns the worst.
    Fast alone is measured again right before each load: the ratio's two sides come from
    the same minute, so the machine's drift over the sweep does not enter it."""
    worst_ratio, worst_standard = 0.0, 0.0
    for prompt_name, messages in SWEEP_PROMPTS.items():
        point = argparse.Namespace(
            **{**vars(args), "messages": messages, "probe_tokens": 32, "probes": args.sweep_probes}
        )
        for tokens, clients in itertools.product(SWEEP_LOAD_TOKENS, SWEEP_LOAD_CLIENTS):
            loaded = argparse.Namespace(
                **{**vars(point), "load_tokens": tokens, "load_clients": clients}
            )
            alone, _, _ = await scenario(url, key, "fast", None, point)
            alone_p50 = quantile(alone.ttft_s, 0.5)
            fast, _, _ = await scenario(url, key, "fast", "standard", loaded)
            standard, _, _ = await scenario(url, key, "standard", "fast", loaded)
            ratio = quantile(fast.ttft_s, 0.5) / alone_p50
            standard_p99 = quantile(standard.ttft_s, 0.99)
            worst_ratio, worst_standard = max(worst_ratio, ratio), max(worst_standard, standard_p99)
            print(
                f"| {label} | {prompt_name} | {clients} x {tokens} | {alone_p50 * 1000:.0f} "
                f"| {quantile(fast.ttft_s, 0.5) * 1000:.0f} | {ratio:.2f}x "
                f"| {standard_p99:.1f} | {fast.errors + standard.errors} |",
                flush=True,
            )
    return (
        f"worst fast TTFT p50 under standard load / alone = {worst_ratio:.2f}x (target <= 1.5x); "
        f"worst standard TTFT p99 under fast load = {worst_standard:.1f} s (target <= 10 s)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--probes", type=int, default=12, help="probe requests per scenario")
    parser.add_argument(
        "--load-clients", type=int, default=16, help="closed-loop clients of the loading tier"
    )
    parser.add_argument("--load-tokens", type=int, default=256, help="max_tokens of the load")
    parser.add_argument("--probe-tokens", type=int, default=16, help="max_tokens of a probe")
    parser.add_argument(
        "--sweep-probes", type=int, default=24, help="probe requests per workload of the sweep"
    )
    parser.add_argument("--warmup-s", type=float, default=5.0, help="load before probing")
    parser.add_argument(
        "--no-sweep", action="store_true", help="skip the workload sweep (admission on)"
    )
    parser.add_argument("--sweep-only", action="store_true", help="only the workload sweep")
    parser.add_argument("--engine-url", help="a running vLLM (tiny, shared variant) to reuse")
    parser.add_argument(
        "--load-unstreamed",
        action="store_true",
        help="the load asks for whole answers, not streams (probes stream, to time them)",
    )
    args = parser.parse_args()
    args.messages = PROMPT
    asyncio.run(run(args))


if __name__ == "__main__":
    main()
