"""Metering benchmark: admission latency and usage-event throughput on this machine.

Starts its own embedded Valkey and a SQLite ledger in a temp dir, then measures, each
against a baseline in the same run:

* admission: ``RedisMeter.admit`` (one Lua script: GCRA x2, suspension, reservation)
  per-call latency p50/p99 vs a bare Redis PING round trip on the same client;
* usage events: ``RedisMeter.settle`` (price, Lua, XADD) from concurrent requests through
  the stream into the ledger by the real consumer, vs raw XADD of the same payloads.

    .venv/bin/python bench/metering.py [--admissions 3000] [--events 5000]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import threading
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

import redis
from redis.asyncio import Redis
from sqlalchemy import func, select

from billing.ledger import UsageRow, make_engine, migrate
from billing.ledger.consumer import UsageStreamConsumer
from billing.meter.events import UsageEvent
from billing.meter.keyspace import Keyspace
from billing.meter.protocol import AdmissionRequest, UsageReport
from billing.meter.redis_meter import RedisMeter
from billing.settings import BillingSettings
from serving.valkey import start_valkey


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def request(n: int) -> AdmissionRequest:
    return AdmissionRequest(
        request_id=f"bench-{uuid.uuid4().hex}",
        org_id=f"org-{n % 50}",
        key_id=f"key-{n % 200}",
        plan="enterprise",
        tier="fast",
        model="composer-2.5",
        prompt_tokens=500,
        max_output_tokens=200,
        customer_id=f"cus_{n % 50}",
    )


async def bench_admission(settings: BillingSettings, n: int) -> tuple[list[float], list[float]]:
    meter = RedisMeter(settings)
    client: Redis = meter.redis
    ping, admit = [], []
    try:
        for i in range(200):  # warm the connection and the script cache
            await client.ping()
            await meter.admit(request(i))
        for i in range(n):
            started = time.perf_counter()
            await client.ping()
            ping.append(time.perf_counter() - started)
            started = time.perf_counter()
            await meter.admit(request(i))
            admit.append(time.perf_counter() - started)
    finally:
        await meter.aclose()  # on the loop its connections were made on
    return ping, admit


async def settle_many(meter: RedisMeter, n: int, concurrency: int) -> float:
    queue = list(range(n))

    async def worker() -> None:
        while queue:
            i = queue.pop()
            req = request(i)
            admission = await meter.admit(req)
            now = datetime.now(UTC)
            usage = UsageReport(
                request_id=req.request_id,
                org_id=req.org_id,
                key_id=req.key_id,
                model=req.model,
                tier=req.tier,
                prompt_tokens=500,
                cached_tokens=100,
                completion_tokens=150,
                started_at=now,
                ended_at=now,
                outcome="complete",
                customer_id=req.customer_id,
            )
            await meter.settle(admission, usage)

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    elapsed = time.perf_counter() - started
    await meter.aclose()
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--admissions", type=int, default=3000)
    parser.add_argument("--events", type=int, default=5000)
    parser.add_argument("--concurrency", type=int, default=32)
    args = parser.parse_args()

    workdir = Path(tempfile.mkdtemp(prefix="cstack-bench-"))
    server = start_valkey()
    try:
        settings = BillingSettings(
            redis_url=server.connection_url,
            ledger_url=f"sqlite:///{workdir / 'ledger.db'}",
            usage_spool_dir=workdir / "spool",
        )
        ping, admit = asyncio.run(bench_admission(settings, args.admissions))
        ms = 1000.0
        p50_ping, p99_ping = percentile(ping, 0.5) * ms, percentile(ping, 0.99) * ms
        p50, p99 = percentile(admit, 0.5) * ms, percentile(admit, 0.99) * ms
        print(f"admission ({args.admissions} sequential calls, local Valkey)")
        print(f"  Redis PING round trip   p50 {p50_ping:.3f} ms  p99 {p99_ping:.3f} ms")
        print(f"  RedisMeter.admit        p50 {p50:.3f} ms  p99 {p99:.3f} ms")
        print(f"  admit / PING            p50 x{p50 / p50_ping:.2f}  p99 x{p99 / p99_ping:.2f}")
        print(
            f"  mean {statistics.fmean(admit) * ms:.3f} ms; target p50 <= 0.5 ms: "
            f"{'met' if p50 <= 0.5 else 'NOT met'}"
        )

        # Raw XADD of the same event payloads: the floor for getting events into Redis.
        sync = redis.Redis.from_url(settings.redis_url)
        payload = b'{"event_id":"x","pad":"' + b"x" * 450 + b'"}'
        started = time.perf_counter()
        pipe = sync.pipeline(transaction=False)
        for _ in range(args.events):
            pipe.xadd("bench:raw", {"event": payload})
        pipe.execute()
        raw_rate = args.events / (time.perf_counter() - started)

        engine = make_engine(settings.ledger_url)
        migrate(engine)
        consumer = UsageStreamConsumer(sync, engine, settings)
        consumer.ensure_group()
        done = threading.Event()

        streams = Keyspace(settings.billing_shards, settings.usage_stream).usage_streams()

        def drain() -> None:
            while not done.is_set() or sum(sync.xlen(stream) for stream in streams):
                consumer.drain(max_seconds=5)

        started = time.perf_counter()
        drainer = threading.Thread(target=drain)
        drainer.start()
        settle_s = asyncio.run(settle_many(RedisMeter(settings), args.events, args.concurrency))
        done.set()
        drainer.join()
        total_s = time.perf_counter() - started
        with engine.connect() as connection:
            rows = connection.execute(select(func.count()).select_from(UsageRow)).scalar_one()
        assert rows == args.events, f"ledger has {rows} rows, expected {args.events}"
        print(
            f"usage events ({args.events}, {args.concurrency} concurrent requests, SQLite ledger)"
        )
        print(f"  raw pipelined XADD            {raw_rate:10.0f} events/s")
        print(f"  admit+settle into the stream  {args.events / settle_s:10.0f} events/s")
        print(f"  hook -> Redis -> ledger       {args.events / total_s:10.0f} events/s")
        print(f"  end-to-end / raw XADD         x{(args.events / total_s) / raw_rate:.3f}")

        # The ledger side alone: a backlog of events drained by one consumer.
        now = datetime.now(UTC)
        pipe = sync.pipeline(transaction=False)
        for n in range(args.events):
            backlog_event = UsageEvent(
                event_id=f"backlog-{n}",
                org_id=f"org-{n % 50}",
                key_id="key-1",
                customer_id=f"cus_{n % 50}",
                plan="enterprise",
                model="composer-2.5",
                tier="fast",
                prompt_tokens=500,
                cached_tokens=100,
                completion_tokens=150,
                list_cost_nano_usd=3_450_000,
                allowance_cost_nano_usd=3_450_000,
                price_version="2026-11-01",
                started_at=now,
                ended_at=now,
                outcome="complete",
            )
            # The stream of releases before sharding, which the consumer drains too.
            pipe.xadd(settings.usage_stream, {"event": backlog_event.model_dump_json()})
        pipe.execute()
        started = time.perf_counter()
        while sync.xlen(settings.usage_stream):
            consumer.drain(max_seconds=30)
        drain_rate = args.events / (time.perf_counter() - started)
        print(f"  ledger consumer alone         {drain_rate:10.0f} events/s (backlog)")
    finally:
        server.stop()


if __name__ == "__main__":
    main()
