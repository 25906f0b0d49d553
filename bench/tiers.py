"""The fast tier's promise under load: real vLLM, both tiers on one engine, mixed load.

    python bench/tiers.py [--probes 12] [--load-clients 16] [--load-tokens 256]

Starts what `cstack up` runs (the tiny checkpoint on vLLM's shared variant, an
authenticated Valkey, `cstack gateway` with billing on) and measures, through the gateway:

1. fast alone: time to first token (TTFT) and inter-token latency (ITL) of a sequential
   probe;
2. the fast probe while standard load at twice the engine's batch size runs (closed loop);
3. a standard probe while fast load saturates the engine;
4. goodput per tier (completion tokens/s) during 2 and 3.

The headline is the production configuration (tier-aware engine admission on); the same
scenarios with ``CSTACK_ENGINE_ADMISSION=false`` (vLLM's priority scheduling alone) are
the labelled extra rows, from the same run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from billed_stack import billed_gateway, tiny_engine

PROMPT = [{"role": "user", "content": "Write a long story about a lighthouse keeper."}]


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


async def stream_once(
    client: httpx.AsyncClient, tier: str, max_tokens: int
) -> tuple[float, list[float], int]:
    """(TTFT, gaps between content chunks, content chunks) of one streamed completion."""
    body = {
        "model": f"composer-2.5-{tier}",
        "messages": PROMPT,
        "max_tokens": max_tokens,
        "stream": True,
        "ignore_eos": True,
    }
    started = time.perf_counter()
    stamps: list[float] = []
    async with client.stream("POST", "/v1/chat/completions", json=body) as response:
        if response.status_code != 200:
            await response.aread()
            raise RuntimeError(f"{response.status_code}: {response.text[:200]}")
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("choices") and chunk["choices"][0]["delta"].get("content"):
                stamps.append(time.perf_counter())
    if not stamps:
        raise RuntimeError("no content")
    gaps = [b - a for a, b in itertools.pairwise(stamps)]
    return stamps[0] - started, gaps, len(stamps)


async def probe(client: httpx.AsyncClient, tier: str, count: int, result: Probe) -> None:
    for _ in range(count):
        try:
            ttft, gaps, _ = await stream_once(client, tier, 16)
        except (RuntimeError, httpx.HTTPError):
            result.errors += 1
            continue
        result.ttft_s.append(ttft)
        result.itl_s.extend(gaps)


async def load(client: httpx.AsyncClient, tier: str, tokens: int, result: Load) -> None:
    while True:
        try:
            _, _, chunks = await stream_once(client, tier, tokens)
            result.tokens += chunks
        except (RuntimeError, httpx.HTTPError):
            result.errors += 1
            await asyncio.sleep(0.5)


async def scenario(
    url: str, key: str, probe_tier: str, load_tier: str | None, args: argparse.Namespace
) -> tuple[Probe, Load, float]:
    headers = {"authorization": f"Bearer {key}"}
    limits = httpx.Limits(max_connections=args.load_clients + 4)
    async with httpx.AsyncClient(
        base_url=url, headers=headers, timeout=300, limits=limits
    ) as client:
        background = Load()
        tasks = []
        if load_tier is not None:
            tasks = [
                asyncio.create_task(load(client, load_tier, args.load_tokens, background))
                for _ in range(args.load_clients)
            ]
            await asyncio.sleep(args.warmup_s)  # the engine fills up
        measured = Probe()
        started, before = time.perf_counter(), background.tokens
        await probe(client, probe_tier, args.probes, measured)
        elapsed = time.perf_counter() - started
        goodput = Load(background.tokens - before, background.errors)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return measured, goodput, elapsed


@contextlib.contextmanager
def stack(tmp: Path, admission: bool, engine_url: str, engine_key: str) -> Iterator[str]:
    """`cstack gateway` (billing on) in front of the engine; its URL, with a key made."""
    env = {
        "CSTACK_UPSTREAM_URL": engine_url,
        "CSTACK_UPSTREAM_API_KEY": engine_key,
        "CSTACK_ENGINE_ADMISSION": str(admission).lower(),
    }
    with billed_gateway(tmp, f"admission-{admission}", env) as gateway:
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
        with tiny_engine(tmp) as (engine_url, engine_key):
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
            for admission in (True, False):
                alone = results[(admission, "fast alone p50")]
                loaded = results[(admission, "fast under standard load p50")]
                starved = results[(admission, "standard under fast load p99")]
                print(
                    f"admission {'on' if admission else 'off'}: fast TTFT p50 under standard "
                    f"load / alone = {loaded / alone:.2f}x (target <= 1.5x); standard TTFT p99 "
                    f"under fast load = {starved:.1f} s (target <= 10 s)"
                )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--probes", type=int, default=12, help="probe requests per scenario")
    parser.add_argument(
        "--load-clients", type=int, default=16, help="closed-loop clients of the loading tier"
    )
    parser.add_argument("--load-tokens", type=int, default=256, help="max_tokens of the load")
    parser.add_argument("--warmup-s", type=float, default=5.0, help="load before probing")
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
