"""The real billing worker (`cstack worker billing` + `cstack beat`, Celery on Redis) is
SIGKILLed mid-batch and restarted: every usage event ends up in the ledger exactly once.
The entries the killed worker had read but not acknowledged are reclaimed (XAUTOCLAIM)."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import redis
from billing_support import Process, StripeStandIn, wait_for
from pydantic import SecretStr
from sqlalchemy import func, select

from billing.events import UsageEvent
from billing.ledger import UsageRow, make_engine, migrate
from billing.settings import BillingSettings

EVENTS = 3000
CUSTOMERS = ("cus_W0", "cus_W1")


def usage_event(n: int) -> UsageEvent:
    # Minutes ago, so that its minute is closed and reported to Stripe right away.
    at = datetime.now(UTC) - timedelta(minutes=3)
    return UsageEvent(
        event_id=f"worker-{n}",
        org_id="org-worker",
        key_id="key-1",
        customer_id=CUSTOMERS[n % 2],
        plan="pro",
        model="composer-2.5",
        tier="standard",
        prompt_tokens=n,
        cached_tokens=0,
        completion_tokens=1,
        list_cost_nano_usd=n * 500 + 2500,
        allowance_consumed_nano_usd=n * 500 + 2500,
        price_version="2026-11-01",
        started_at=at,
        ended_at=at,
        outcome="complete",
    )


def test_worker_killed_mid_batch_then_restarted_writes_each_event_once(
    billing_settings: BillingSettings,
    billing_processes: Callable[..., Process],
    stripe_server: Callable[..., StripeStandIn],
) -> None:
    stripe = stripe_server(fail_first=3)
    settings = billing_settings.model_copy(
        update={
            "ledger_batch_size": 20,
            "ledger_claim_idle_ms": 1000,
            "ledger_drain_interval_s": 0.2,
            "stripe_api_base": stripe.base_url,
            "stripe_api_key": SecretStr("sk_test_worker"),
            "stripe_sync_interval_s": 0.5,
            "stripe_retry_base_s": 0.5,
        }
    )
    client = redis.Redis.from_url(settings.redis_url)
    pipe = client.pipeline(transaction=False)
    for n in range(EVENTS):
        pipe.xadd(settings.usage_stream, {"event": usage_event(n).model_dump_json()})
    pipe.execute()
    engine = make_engine(settings.ledger_url)
    database_path = str(engine.url.database)
    migrate(engine)

    def ledger_rows() -> int:
        with engine.connect() as connection:
            return int(connection.execute(select(func.count()).select_from(UsageRow)).scalar_one())

    billing_processes(["beat"], settings)
    worker = billing_processes(["worker", "billing"], settings)
    wait_for(lambda: ledger_rows() > 0, 120, "the worker to write its first rows")
    # Hold the ledger's write lock so the worker blocks inside its next batch: read from
    # the stream, not yet committed, not acknowledged. Then kill it there.
    blocker = sqlite3.connect(database_path, timeout=30, isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")
    wait_for(
        lambda: client.xpending(settings.usage_stream, settings.usage_consumer_group)["pending"],
        60,
        "the worker to read a batch it cannot commit",
    )
    worker.kill()
    blocker.execute("ROLLBACK")
    blocker.close()
    written_before_kill = ledger_rows()
    pending = client.xpending(settings.usage_stream, settings.usage_consumer_group)["pending"]
    assert 0 < written_before_kill < EVENTS
    assert pending > 0, "the kill must leave read-but-unacknowledged entries"

    billing_processes(["worker", "billing"], settings)
    wait_for(lambda: ledger_rows() == EVENTS, 180, "every event in the ledger")
    wait_for(
        lambda: (
            client.xpending(settings.usage_stream, settings.usage_consumer_group)["pending"] == 0
        ),
        60,
        "no entry left pending",
    )
    with engine.connect() as connection:
        prompt_total, distinct = connection.execute(
            select(func.sum(UsageRow.prompt_tokens), func.count(func.distinct(UsageRow.event_id)))
        ).one()
    assert distinct == EVENTS
    assert prompt_total == sum(range(EVENTS))
    assert client.xlen(settings.usage_stream) == 0
    assert client.xlen(settings.usage_dead_letter_stream) == 0

    # Meanwhile the worker reported the usage to Stripe (through injected failures and the
    # kill): each meter event accepted once, and the values add up to the ledger.
    expected = {
        (customer, f"composer_standard_{direction}_tokens"): sum(
            (n if direction == "input" else 1)
            for n in range(EVENTS)
            if CUSTOMERS[n % 2] == customer
        )
        for customer in CUSTOMERS
        for direction in ("input", "output")
    }

    def reported() -> dict[tuple[str, str], int]:
        totals: dict[tuple[str, str], int] = {}
        for record in stripe.accepted():
            key = (record["customer"], record["event_name"])
            totals[key] = totals.get(key, 0) + int(record["value"])
        return totals

    wait_for(lambda: reported() == expected, 120, "Stripe to have all the usage")
    identifiers = [record["identifier"] for record in stripe.accepted()]
    assert len(identifiers) == len(set(identifiers))
    assert any(r["result"] == "failed" for r in stripe.requests())
