"""Prefix-cache-aware routing against round-robin and least-outstanding, on real vLLM
replicas, with a multi-turn agent replay; and the routing decision's own cost.

    .venv/bin/python bench/prefix_routing.py [--sessions 12] [--turns 6] [--concurrency 4]
        [--replicas 2 4] [--cache-blocks N]

Starts ``--replicas`` vLLM engines (the standard variant, cpu profile; 2, then 4) on the
tiny checkpoint, their KV cache vLLM's default (1 GiB, more than the replay needs) or
``--cache-blocks`` blocks each. Each time, for each routing policy, `cstack gateway` as
production runs it (billing on, default settings but ``CSTACK_ROUTING``) with the engines
as the tier's replicas. It replays the same shape of traffic through each: ``--sessions``
conversations, ``--concurrency`` at a time, each of ``--turns`` turns (a shared system
prompt, a long first message of its own, then an answer and a short follow-up per turn),
streamed. Each policy's traffic has its own random text, so no policy finds the cache of
another's.

Reported per policy: vLLM's own prefix-cache counters summed over the engines
(``vllm:prefix_cache_hits`` / ``vllm:prefix_cache_queries``, in tokens), TTFT p50/p99 and
the requests each engine served. Then the routing decision itself, in process: prefix key
and pick over two replicas, for conversations of 8, 64 and 256 messages.

vLLM's CPU build turns prefix caching off for MLA models (the tiny DeepSeek-V3 checkpoint,
like composer-2.5), so the engines here serve the tiny checkpoint's Qwen3-MoE twin (same
tokenizer and chat template, GQA attention), whose prefix cache the CPU build keeps.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import secrets
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from billed_stack import billed_gateway
from prometheus_client.parser import text_string_to_metric_families

from gateway.api.protocol import ChatCompletionRequest
from gateway.api.shaping import prefix_key
from gateway.upstream.routing import ROUTING_POLICIES, PrefixTable
from serving.engine import engine_for_variant
from serving.launcher import VllmServer
from serving.process import free_port
from serving.settings import ServingSettings
from serving.tiny import build_tiny_checkpoint

#: 30 made-up words: random text the tokenizer splits into a few tokens per word.
WORDS = [
    a + b for a in ("al", "be", "ga", "de", "ep", "ze") for b in ("pha", "ta", "mma", "lo", "on")
]


def text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


@dataclass
class Result:
    ttft_s: list[float] = field(default_factory=list)
    errors: int = 0
    first_error: str = ""


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def engine_counters(urls: list[str]) -> dict[str, float]:
    """Summed prefix-cache counters and requests, per engine and in total."""
    totals: dict[str, float] = {}
    for index, url in enumerate(urls):
        for family in text_string_to_metric_families(httpx.get(f"{url}/metrics").text):
            for sample in family.samples:
                name = {
                    "vllm:prefix_cache_hits_total": "hits",
                    "vllm:prefix_cache_queries_total": "queries",
                    "vllm:request_success_total": f"requests-{index}",
                }.get(sample.name)
                if name is not None:
                    totals[name] = totals.get(name, 0.0) + sample.value
    return totals


async def session(
    client: httpx.AsyncClient,
    gateway_key: str,
    system: str,
    rng: random.Random,
    args: argparse.Namespace,
    result: Result,
) -> None:
    messages = [
        {"role": "system", "content": system},
        {"role": "user", "content": text(rng, args.first_words)},
    ]
    for _ in range(args.turns):
        body = {
            "model": "composer-2.5",
            "messages": messages,
            "max_tokens": args.answer_tokens,
            "stream": True,
            "service_tier": "standard",
        }
        started = time.perf_counter()
        answer: list[str] = []
        first = None
        async with client.stream(
            "POST",
            "/v1/chat/completions",
            json=body,
            headers={"authorization": f"Bearer {gateway_key}"},
        ) as response:
            if response.status_code != 200:
                result.errors += 1
                result.first_error = result.first_error or (await response.aread()).decode()
                return
            async for line in response.aiter_lines():
                if line.startswith("data: {") and '"content"' in line:
                    first = first or time.perf_counter()
                    answer.append(line)
        result.ttft_s.append((first or time.perf_counter()) - started)
        messages.append({"role": "assistant", "content": text(rng, args.answer_tokens)})
        messages.append({"role": "user", "content": text(rng, args.follow_words)})


async def replay(url: str, key: str, policy: str, args: argparse.Namespace) -> Result:
    rng = random.Random(f"{policy}-{args.seed}")
    system = f"[{policy}] " + text(rng, args.system_words)
    result = Result()
    gate = asyncio.Semaphore(args.concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=300) as client:

        async def one(index: int) -> None:
            async with gate:
                await session(client, key, system, random.Random(f"{policy}-{index}"), args, result)

        await asyncio.gather(*(one(i) for i in range(args.sessions)))
    return result


def decision_cost(messages: int, rounds: int = 2000) -> tuple[float, float]:
    """p50 and p99 in microseconds of one routing decision: the prefix key of a parsed
    request, the pick among two replicas and recording the choice. CPU time of this
    thread, not wall time: on a shared 2-core machine the wall time's tail is the
    scheduler's 4 ms time slices given to other processes, not the decision."""
    rng = random.Random(messages)
    replicas = ["a", "b"]
    table: PrefixTable[str] = PrefixTable()
    conversations = [
        [{"role": "system", "content": text(rng, 200)}]
        + [
            {"role": "user" if i % 2 else "assistant", "content": text(rng, 40)}
            for i in range(messages - 1)
        ]
        for _ in range(20)
    ]
    parsed = [
        ChatCompletionRequest.model_validate({"model": "composer-2.5", "messages": c})
        for c in conversations
    ]
    times = []
    for i in range(rounds):
        request = parsed[i % len(parsed)]
        started = time.thread_time_ns()
        key = prefix_key(request, None)
        replica = table.pick(key, replicas, lambda r: 0, lambda c, turn=i: c[turn % 2])
        table.record(key, replica)
        times.append((time.thread_time_ns() - started) / 1000)
    return quantile(times, 0.5), quantile(times, 0.99)


def start_engines(
    tmp: Path, model: Path, engine_key: str, replicas: int, cache_blocks: int | None
) -> list[VllmServer]:
    """``replicas`` standard-variant engines; ``cache_blocks``: each holds that many KV
    blocks (of 16 tokens) at most, as a busy production engine's cache is always full."""
    engines = []
    for index in range(replicas):
        engine = engine_for_variant(
            "standard",
            model,
            free_port(),
            ServingSettings(serving_profile="cpu"),
            log_path=tmp / f"vllm-{replicas}-{index}.log",
            api_key=engine_key,
            eager=True,
        )
        if cache_blocks is not None:  # a test knob of vLLM's, not a variant's argument
            engine.command += ["--num-gpu-blocks-override", str(cache_blocks)]
        engines.append(engine)
    for engine in engines:
        engine.start()
    for engine in engines:
        engine.wait_healthy(timeout_s=900)
    return engines


async def scenario(
    tmp: Path, urls: list[str], engine_key: str, label: str, args: argparse.Namespace
) -> dict[str, float]:
    """Each policy's replay on these engines; their hit rates."""
    rates: dict[str, float] = {}
    for policy in ROUTING_POLICIES:
        env = {
            "CSTACK_STANDARD_UPSTREAM_URLS": ",".join(urls),
            "CSTACK_FAST_UPSTREAM_URLS": ",".join(urls),
            "CSTACK_UPSTREAM_API_KEY": engine_key,
            "CSTACK_ROUTING": policy,
        }
        with billed_gateway(tmp, f"{policy}-{label}", env) as gateway:
            before = engine_counters(urls)
            result = await replay(gateway.url, gateway.key, f"{policy}-{label}", args)
            after = engine_counters(urls)
        delta = {name: after.get(name, 0) - before.get(name, 0) for name in after}
        rates[policy] = delta["hits"] / max(1.0, delta["queries"])
        name = policy if policy == "prefix" else f"{policy} (comparison)"
        ttft = [v * 1000 for v in result.ttft_s]
        spread = " / ".join(f"{delta[f'requests-{i}']:.0f}" for i in range(len(urls)))
        print(
            f"| {label} | {name} | {rates[policy]:.1%} | {delta['hits']:.0f} / "
            f"{delta['queries']:.0f} | {quantile(ttft, 0.5):.0f} | "
            f"{quantile(ttft, 0.99):.0f} | {spread} | {result.errors} |",
            flush=True,
        )
        if result.first_error:
            print(f"first error ({policy}): {result.first_error[:300]}")
    return rates


async def run(args: argparse.Namespace) -> None:
    print(
        f"{args.sessions} sessions x {args.turns} turns, {args.concurrency} at a time; "
        "`cstack gateway` with billing on"
    )
    print("| engines | routing | prefix-cache hit rate | hits / queries (tokens) "
          "| TTFT p50 ms | TTFT p99 ms | requests per engine | errors |")  # fmt: skip
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    summary = []
    with tempfile.TemporaryDirectory(prefix="cstack-bench-routing-") as scratch:
        tmp = Path(scratch)
        model = build_tiny_checkpoint(tmp / "tiny-qwen", seed=0, architecture="qwen3_moe")
        engine_key = secrets.token_urlsafe(24)
        for replicas in args.replicas:
            label = f"{replicas}" + (
                f", {args.cache_blocks} KV blocks each" if args.cache_blocks else ""
            )
            engines = start_engines(tmp, model, engine_key, replicas, args.cache_blocks)
            try:
                urls = [engine.base_url for engine in engines]
                rates = await scenario(tmp, urls, engine_key, label, args)
            finally:
                for engine in engines:
                    engine.stop()
            for other in ("round_robin", "least_outstanding"):
                ratio = rates["prefix"] / max(rates[other], 1e-9)
                summary.append(f"{label} engines: hit rate, prefix / {other} = {ratio:.2f}x")
    print("\n".join(summary) + "  (target: >= 2x round_robin's)")
    for messages in (8, 64, 256):
        p50, p99 = decision_cost(messages)
        print(f"routing decision (CPU time), {messages} messages: p50 {p50:.0f} us, "
              f"p99 {p99:.0f} us (target p99 < 1 ms)")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=12, help="conversations per policy")
    parser.add_argument("--turns", type=int, default=6, help="requests per conversation")
    parser.add_argument("--concurrency", type=int, default=4, help="conversations at a time")
    parser.add_argument("--system-words", type=int, default=40, help="shared system prompt")
    parser.add_argument("--first-words", type=int, default=120, help="each first message")
    parser.add_argument("--follow-words", type=int, default=15, help="each follow-up")
    parser.add_argument("--answer-tokens", type=int, default=16, help="max_tokens per turn")
    parser.add_argument(
        "--replicas", type=int, nargs="+", default=[2, 4], help="engines, one run each"
    )
    parser.add_argument(
        "--cache-blocks",
        type=int,
        default=None,
        help="KV blocks per engine (16 tokens each; default: vLLM's, 1 GiB)",
    )
    parser.add_argument("--seed", type=int, default=0)
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
