"""A Redis Cluster primary killed under paced traffic through a real gateway process: at
least 99% of requests are answered, and the ledger holds every answered request exactly
once once the replica has taken over and the spool is replayed.

The primary killed is the one holding the org's budget (the request path's shard); the
gateway admits its requests on the outage allowance until the replica takes over, keeps
verified keys for its outage grace, and spools what it could not settle. The upstream is
the fast stand-in: the subject is the gateway and billing, not the engine.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from sqlalchemy import select

from billing.ledger import UsageRow, make_engine, migrate
from billing.ledger.consumer import UsageStreamConsumer
from billing.redis.client import async_client, sync_client
from billing.settings import BillingSettings
from gateway.access.keys import KeyStore
from tests.support.billing import keyspace
from tests.support.fakes.valkey_cluster import ValkeyCluster
from tests.support.gateway_processes import gateway_processes
from tests.support.traffic import paced_chat
from tests.support.waits import wait_until

pytestmark = pytest.mark.asyncio(loop_scope="session")

REQUESTS = 300
RATE_PER_S = 30.0
KILL_AFTER_S = 3.0
ORG = "org-cluster-chaos"


async def test_a_primary_killed_under_traffic_costs_under_one_percent_and_loses_nothing(
    billing_settings: BillingSettings, usage_upstream: str, tmp_path: Path
) -> None:
    cluster = ValkeyCluster().start()
    settings = billing_settings.model_copy(
        update={"redis_url": cluster.url, "redis_timeout_s": 1.0}
    )
    try:
        redis = sync_client(settings.redis_url)
        store_client = async_client(settings.redis_url)
        store = KeyStore(store_client, "pro")
        await store.create_org(ORG, plan="pro")
        token, _ = await store.create_key(ORG, plan="pro")
        await store_client.aclose()  # type: ignore[attr-defined]
        victim = cluster.primary_of(keyspace(settings).budget_prefix(ORG))
        values = {**settings.model_dump(), "revocation_poll_s": 0.2}
        with gateway_processes(values, usage_upstream, tmp_path, count=1) as urls:

            async def kill() -> None:
                await asyncio.sleep(KILL_AFTER_S)
                await asyncio.to_thread(cluster.kill, victim)

            traffic = await paced_chat(urls[0], token, REQUESTS, RATE_PER_S, kill())
            answered = traffic.answered
            cluster.wait_failover(keyspace(settings).budget_prefix(ORG))

            assert len(answered) / REQUESTS >= 0.99, (len(answered), traffic.others)
            engine = make_engine(settings.ledger_url)
            migrate(engine)
            consumer = UsageStreamConsumer(redis, engine, settings)

            def in_ledger() -> list[str]:
                consumer.drain(max_seconds=5)
                with engine.connect() as connection:
                    return list(connection.execute(select(UsageRow.event_id)).scalars())

            # The gateway replays its spool once Redis answers for the shard again.
            wait_until(lambda: len(in_ledger()) >= len(answered), "every answer in the ledger", 120)
        ids = in_ledger()
        assert len(ids) == len(set(ids)) and set(ids) == set(answered)
        print(f"cluster chaos run: {len(answered)}/{REQUESTS} answered, {len(ids)} ledger rows")
    finally:
        cluster.stop()
