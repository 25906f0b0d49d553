"""Fairness between orgs inside a tier: org B's time to first token while org A sends the
same load as B, and while A sends ten times B's concurrency, through `cstack gateway` as
production runs it (billing on) in front of one real vLLM engine (the `shared` variant).

Both orgs stream fast-tier completions in closed loops on the same engine, each org from a
process of its own (customers do not share an event loop: in one, A's tenfold load delays
the reading of B's first token and the benchmark measures its own client). Each scenario
counts the requests started after ``--warmup-s`` of both orgs' load: when both start at
once, the org whose requests reach an empty tier first takes every slot (work-conserving)
and the other's first requests wait for those to end, a start-up moment that would be
most of a p99 over a few hundred requests. With the gateway's fair engine slots, A's
excess queues behind A's own requests: B's TTFT p99 under A's tenfold load should stay
within 1.2x of what it is when A matches B, and the engine's total throughput should not
move. With B at 4 clients (the default) the two orgs already fill the engine's 8 slots
when A matches B, so both scenarios run the same batch and only the queue differs; with
fewer the engine is not full at 1x and A's tenfold load also grows its batch (a slower
step for everyone, which no admission order removes).

A p99 of one scenario's few hundred requests is its third-worst request: one pause of the
shared machine decides it. So the scenarios run ``--rounds`` times, in turn (1x then 10x,
then 10x then 1x, ...), and each scenario's requests of every round are pooled: the
headline is the ratio of the pooled p99s. Each round's own ratio is printed too.

    .venv/bin/python bench/fairness.py [--engine-url URL] [--seconds 30] [--rounds 3]
        [--b-clients 4]
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import httpx
from billed_stack import billed_gateway, tiny_engine
from tiers import quantile, stream_once


async def closed_loop(
    url: str, key: str, clients: int, tokens: int, seconds: float, warmup_s: float = 0.0
) -> tuple[list[float], int, int]:
    """(TTFTs, streamed tokens, errors) of ``clients`` closed-loop streams for ``seconds``
    after ``warmup_s`` (requests started in the warm-up are not counted)."""
    ttfts: list[float] = []
    counts = {"tokens": 0, "errors": 0}
    measured_from = time.perf_counter() + warmup_s
    deadline = measured_from + seconds
    limits = httpx.Limits(max_connections=clients + 2)
    headers = {"authorization": f"Bearer {key}"}
    async with httpx.AsyncClient(
        base_url=url, headers=headers, timeout=300, limits=limits
    ) as client:

        async def one() -> None:
            while (started := time.perf_counter()) < deadline:
                try:
                    ttft, _, streamed = await stream_once(client, "fast", tokens)
                except (RuntimeError, httpx.HTTPError) as exc:
                    if not counts["errors"]:
                        print(f"first error: {exc!r}", flush=True)
                    counts["errors"] += 1
                    await asyncio.sleep(0.2)
                    continue
                if started >= measured_from:
                    ttfts.append(ttft)
                    counts["tokens"] += streamed

        await asyncio.gather(*(one() for _ in range(clients)))
    return ttfts, counts["tokens"], counts["errors"]


def org_load(
    url: str, key: str, clients: int, tokens: int, seconds: float, warmup_s: float = 0.0
) -> tuple[list[float], int, int]:
    """One org's :func:`closed_loop`, in a process of its own (an executor's)."""
    return asyncio.run(closed_loop(url, key, clients, tokens, seconds, warmup_s))


async def scenario(
    orgs: ProcessPoolExecutor,
    url: str,
    keys: dict[str, str],
    a_clients: int,
    args: argparse.Namespace,
) -> tuple[list[float], int, int]:
    loop = asyncio.get_running_loop()

    def org(key: str, clients: int) -> asyncio.Future[tuple[list[float], int, int]]:
        return loop.run_in_executor(
            orgs, org_load, url, key, clients, args.tokens, args.seconds, args.warmup_s
        )

    a, b = await asyncio.gather(org(keys["org-a"], a_clients), org(keys["org-b"], args.b_clients))
    return b[0], a[1] + b[1], a[2] + b[2]


def org_keys(internal_url: str, admin_token: str) -> dict[str, str]:
    admin = {"authorization": f"Bearer {admin_token}"}
    keys = {}
    for org in ("org-a", "org-b"):
        httpx.post(
            f"{internal_url}/admin/orgs", json={"org_id": org, "plan": "enterprise"}, headers=admin
        ).raise_for_status()
        keys[org] = httpx.post(f"{internal_url}/admin/orgs/{org}/keys", headers=admin).json()["key"]
    return keys


async def run(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="cstack-bench-fairness-") as scratch:
        tmp = Path(scratch)
        with tiny_engine(tmp, args.engine_url) as (engine_url, engine_key):
            env = {"CSTACK_UPSTREAM_URL": engine_url}
            if engine_key:
                env["CSTACK_UPSTREAM_API_KEY"] = engine_key
            with billed_gateway(tmp, "fairness", env) as gateway:
                keys = org_keys(gateway.internal_url, gateway.admin_token)
                # Spawned, not forked (this process runs an event loop); both started and
                # warmed up before the first scenario.
                orgs = ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("spawn"))
                loop = asyncio.get_running_loop()
                await asyncio.gather(*(
                    loop.run_in_executor(orgs, org_load, gateway.url, keys[org], 1, args.tokens, 3)
                    for org in ("org-a", "org-b")
                ))  # fmt: skip
                loads = (args.b_clients, args.b_clients * 10)
                pooled: dict[int, list[float]] = {a: [] for a in loads}
                rates: dict[int, list[float]] = {a: [] for a in loads}
                errors = 0
                for round_ in range(args.rounds):
                    p99 = {}
                    for a_clients in loads if round_ % 2 == 0 else loads[::-1]:
                        ttfts, tokens, failed = await scenario(
                            orgs, gateway.url, keys, a_clients, args
                        )
                        ms = [t * 1000 for t in ttfts]
                        pooled[a_clients] += ms
                        rates[a_clients].append(tokens / args.seconds)
                        p99[a_clients] = quantile(ms, 0.99)
                        errors += failed
                    print(f"round {round_ + 1}: B's TTFT p99 {p99[loads[0]]:.0f} ms at 1x, "
                          f"{p99[loads[1]]:.0f} ms at 10x: "
                          f"{p99[loads[1]] / p99[loads[0]]:.2f}x", flush=True)  # fmt: skip
                orgs.shutdown()
                print(f"\n| org A's clients (org B: {args.b_clients}) | B requests "
                      "| B TTFT p50 ms | p90 ms | p99 ms | total tokens/s (rounds) |")  # fmt: skip
                print("| --- | --- | --- | --- | --- | --- |")
                for a_clients in loads:
                    ms = pooled[a_clients]
                    print(
                        f"| {a_clients} | {len(ms)} | {quantile(ms, 0.5):.0f} "
                        f"| {quantile(ms, 0.9):.0f} | {quantile(ms, 0.99):.0f} "
                        f"| {' / '.join(f'{r:.0f}' for r in rates[a_clients])} |"
                    )
                ratio = quantile(pooled[loads[1]], 0.99) / quantile(pooled[loads[0]], 0.99)
                print(f"errors: {errors}\nB's TTFT p99, all rounds pooled, with A at 10x / "
                      f"A at 1x = {ratio:.2f}x (target <= 1.2x)")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine-url", help="a running vLLM (tiny, shared variant) to reuse")
    parser.add_argument(
        "--b-clients",
        type=int,
        default=4,
        help="org B's closed-loop clients (4: the two orgs fill the tiny engine's 8 slots at 1x)",
    )
    parser.add_argument("--tokens", type=int, default=32, help="max_tokens of each stream")
    parser.add_argument("--seconds", type=float, default=30.0, help="length of each scenario")
    parser.add_argument(
        "--rounds", type=int, default=3, help="times each scenario runs, in turn (pooled)"
    )
    parser.add_argument(
        "--warmup-s", type=float, default=3.0, help="both orgs' load before each scenario counts"
    )
    args = parser.parse_args()
    if args.rounds < 1 or args.seconds <= 0:
        parser.error("--rounds must be 1 or more and --seconds above 0")
    asyncio.run(run(args))


if __name__ == "__main__":
    main()
