"""The real billing worker (`cstack worker billing` + `cstack beat`, Celery on Redis) is
SIGKILLed mid-batch and restarted: every usage event ends up in the ledger exactly once.
The entries the killed worker had read but not acknowledged are reclaimed (XAUTOCLAIM).
Meanwhile the worker posts the running month to Stripe as it fills (every sync adds
deltas), and in the end Stripe's items add up to the ledger's invoice lines."""

from __future__ import annotations

import sqlite3
import time
import uuid
from collections import defaultdict
from collections.abc import Callable
from datetime import UTC, datetime

import redis
from pydantic import SecretStr
from sqlalchemy import func, select

from billing.ledger import UsageRow, make_engine, migrate
from billing.ledger.invoice import invoice_preview
from billing.meter.events import UsageEvent
from billing.prices.pricing import load_pricebook
from billing.settings import BillingSettings
from billing.stripe.api import list_invoice_items, stripe_client
from billing.worker import renewed
from tests.support.billing import Process, set_customers
from tests.support.fakes.stripe import StripeStandIn
from tests.support.waits import wait_until

EVENTS = 3000
#: Written to the ledger before the worker is blocked and killed.
FIRST_EVENTS = 200
ORGS = {"org-worker-0": "cus_W0", "org-worker-1": "cus_W1"}
#: A fixed instant: the sync posts open months too here (stripe_post_open_periods).
AT = datetime(2026, 11, 15, 12, 0, tzinfo=UTC)


def usage_event(n: int) -> UsageEvent:
    org = f"org-worker-{n % 2}"
    return UsageEvent(
        event_id=f"worker-{n}",
        org_id=org,
        key_id="key-1",
        customer_id=ORGS[org],
        plan="pro",
        model="composer-2.5",
        tier="standard",
        prompt_tokens=n,
        cached_tokens=0,
        completion_tokens=1,
        list_cost_nano_usd=n * 500 + 2500,
        allowance_cost_nano_usd=n * 500 + 2500,
        price_version="2026-11-01",
        started_at=AT,
        ended_at=AT,
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
            "stripe_post_open_periods": True,
            # The killed worker may die holding the sync's lock: its successor syncs then.
            "stripe_sync_lock_ttl_s": 3.0,
        }
    )
    client = redis.Redis.from_url(settings.redis_url)

    def add_events(numbers: range) -> None:
        pipe = client.pipeline(transaction=False)
        for n in numbers:
            pipe.xadd(settings.usage_stream, {"event": usage_event(n).model_dump_json()})
        pipe.execute()

    add_events(range(FIRST_EVENTS))
    engine = make_engine(settings.ledger_url)
    database_path = str(engine.url.database)
    migrate(engine)
    set_customers(engine, dict(ORGS))

    def ledger_rows() -> int:
        with engine.connect() as connection:
            return int(connection.execute(select(func.count()).select_from(UsageRow)).scalar_one())

    billing_processes(["beat"], settings)
    worker = billing_processes(["worker", "billing"], settings)
    wait_until(lambda: ledger_rows() == FIRST_EVENTS, "the worker to write the first events", 120)
    # Hold the ledger's write lock, then send the rest: the worker blocks inside its next
    # batch (read from the stream, not yet committed, not acknowledged), and is killed
    # there. (Sending all at once raced: the worker could write them all before the lock.)
    blocker = sqlite3.connect(database_path, timeout=30, isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")
    add_events(range(FIRST_EVENTS, EVENTS))
    wait_until(
        lambda: client.xpending(settings.usage_stream, settings.usage_consumer_group)["pending"],
        "the worker to read a batch it cannot commit",
        60,
    )
    worker.kill()
    blocker.execute("ROLLBACK")
    blocker.close()
    written_before_kill = ledger_rows()
    pending = client.xpending(settings.usage_stream, settings.usage_consumer_group)["pending"]
    assert 0 < written_before_kill < EVENTS
    assert pending > 0, "the kill must leave read-but-unacknowledged entries"

    billing_processes(["worker", "billing"], settings)
    wait_until(lambda: ledger_rows() == EVENTS, "every event in the ledger", 180)
    wait_until(
        lambda: (
            client.xpending(settings.usage_stream, settings.usage_consumer_group)["pending"] == 0
        ),
        "no entry left pending",
        60,
    )
    with engine.connect() as connection:
        prompt_total, distinct = connection.execute(
            select(func.sum(UsageRow.prompt_tokens), func.count(func.distinct(UsageRow.event_id)))
        ).one()
    assert distinct == EVENTS
    assert prompt_total == sum(range(EVENTS))
    assert client.xlen(settings.usage_stream) == 0
    assert client.xlen(settings.usage_dead_letter_stream) == 0

    # Meanwhile the worker posted the month to Stripe as it filled (through injected
    # failures and the kill): each item accepted once, and Stripe's items per line add up
    # to the ledger's invoice, read back through stripe-python.
    book = load_pricebook(settings.pricebook_path)
    expected = {
        (org, line.key): line.amount_cents
        for org in ORGS
        for line in invoice_preview(engine, book, org, "2026-11").lines
        if line.amount_cents
    }
    client_api = stripe_client(settings)

    def posted() -> dict[tuple[str, str], int]:
        totals: dict[tuple[str, str], int] = defaultdict(int)
        for customer in ORGS.values():
            for item in list_invoice_items(client_api, customer):
                totals[(item.metadata["cstack_org"], item.metadata["cstack_line"])] += (
                    item.amount_cents
                )
        return {key: cents for key, cents in totals.items() if cents}

    wait_until(lambda: posted() == expected, "Stripe to have the ledger's invoices", 120)
    keys = [record["idempotency_key"] for record in stripe.accepted()]
    assert len(keys) == len(set(keys))
    assert "failed" in stripe.results()


def test_a_sync_keeps_its_lock_past_the_ttl_and_a_dead_holders_lock_frees_itself(
    redis_url: str,
) -> None:
    """The Stripe sync's lock (real Valkey): renewed while a sync runs, however long; left
    by a holder that died (no renewal), it is free again after its TTL."""
    client = redis.Redis.from_url(redis_url)
    name = f"cstack:test:sync-lock:{uuid.uuid4().hex[:8]}"
    lock = client.lock(name, timeout=0.6, blocking=False, thread_local=False)  # as the sync's
    assert lock.acquire()
    with renewed(lock, 0.6):
        time.sleep(2.0)  # over three TTLs
        assert not client.lock(name, timeout=0.6, blocking=False).acquire()
        assert lock.owned()
    lock.release()

    dead = client.lock(name, timeout=0.6, blocking=False)
    assert dead.acquire()  # and never renewed, nor released
    successor = client.lock(name, timeout=0.6, blocking=False)
    wait_until(successor.acquire, "the dead holder's lock to expire", 10)
