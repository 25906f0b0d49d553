"""Stripe invoices what the ledger invoices, to the cent, through the whole billing path:
admission and settlement against the session's Valkey (RedisMeter), the usage stream
drained into the ledger by the consumer, invoice items posted by the Stripe sync to the
Stripe stand-in, and `cstack billing reconcile` reading Stripe back through stripe-python.

The price book is the test's own, with fixed instants: two price versions inside
November, and a launch promotion that starts inside November and ends inside December.
The org's allowance is crossed during the promotion; a request is delivered twice; the
stand-in fails the first posts; usage arrives late after November was posted and
changes its lines' items in place. Amounts
are worked out by hand below so that the ledger itself is checked, not only Stripe
against it.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import redis
from pydantic import SecretStr
from typer.testing import CliRunner

from billing.cli import billing_app
from billing.ledger import make_engine, migrate
from billing.ledger.consumer import UsageStreamConsumer
from billing.ledger.invoice import invoice_preview
from billing.meter.protocol import Admission, AdmissionRequest, UsageReport
from billing.meter.redis_meter import RedisMeter
from billing.prices.pricing import load_pricebook
from billing.settings import BillingSettings
from billing.stripe.api import list_invoice_items, stripe_client
from billing.stripe.sync import sync_stripe
from tests.support.billing import keyspace, set_customers, write_test_book
from tests.support.fakes.stripe import StripeStandIn

CUSTOMER = "cus_recon"
VERSIONS = [
    {
        "version": "2026-10-01",
        "effective_from": "2026-10-01T00:00:00Z",
        "tiers": {
            "standard": {"input_per_1m": "0.50", "output_per_1m": "2.50"},
            "fast": {"input_per_1m": "3.00", "output_per_1m": "15.00"},
        },
    },
    {
        "version": "2026-11-16",
        "effective_from": "2026-11-16T00:00:00Z",
        "tiers": {
            "standard": {"input_per_1m": "0.40", "output_per_1m": "2.00"},
            "fast": {"input_per_1m": "2.40", "output_per_1m": "12.00"},
        },
    },
]
#: $1.00 included, then overage: crossed during the promotion below.
PLANS = {
    "recon": {
        "included_usd": "1.00",
        "overage": "billed",
        "overage_budget_usd": "1000.00",
        "rpm": 100000,
        "tpm": 100000000,
    }
}
#: From 2026-11-27T17:00Z to 2026-12-04T17:00Z usage counts half against the allowance.
PROMOTIONS = [
    {
        "id": "test-launch",
        "starts_at": "2026-11-27T17:00:00Z",
        "days": 7,
        "models": ["composer-2.5*"],
        "usage_multiplier": "2",
    }
]


def at(month: int, day: int, hour: int = 12) -> datetime:
    return datetime(2026, month, day, hour, 0, tzinfo=UTC)


#: (request id, started at, tier, prompt tokens, completion tokens), in November.
NOVEMBER = [
    ("r1", at(11, 10), "fast", 10_000, 20_000),  # v1: $0.03 + $0.30
    ("r2", at(11, 10, 13), "standard", 100_000, 50_000),  # v1: $0.05 + $0.125
    ("r3", at(11, 20), "fast", 5_000, 10_000),  # v2: $0.012 + $0.12
    ("r4", at(11, 20, 13), "standard", 33_333, 7_777),  # v2: $0.0133332 + $0.015554
    # Allowance used so far: $0.6658872. In the promotion: $0.768 list counts $0.384,
    # which crosses the $1.00 allowance.
    ("r5", at(11, 28, 10), "fast", 20_000, 60_000),
    ("r6", at(11, 29), "standard", 1_001, 999),
]
LATE = ("r7", datetime(2026, 11, 30, 23, 59, 59, tzinfo=UTC), "fast", 1_234, 4_321)
DECEMBER = [
    ("d1", at(12, 2), "fast", 1_000, 2_000),  # still in the promotion
    ("d2", at(12, 5), "standard", 10_000, 3_000),  # after it
]


async def settle(
    meter: RedisMeter, org: str, request_id: str, started: datetime, tier: Any, p: int, c: int
) -> tuple[Admission, UsageReport]:
    """Admit and settle one request the way the gateway does, with a fixed start time.

    Request ids and the org are the run's own: settled markers and budgets live in the
    session's Valkey, which the SQLite and PostgreSQL runs share.
    """
    request_id = f"{org}-{request_id}"
    admission = await meter.admit(
        AdmissionRequest(
            request_id=request_id,
            org_id=org,
            key_id="key-recon",
            plan="recon",
            tier=tier,
            model="composer-2.5",
            prompt_tokens=p,
            max_output_tokens=c,
            customer_id=CUSTOMER,
        )
    )
    report = UsageReport(
        request_id=request_id,
        org_id=org,
        key_id="key-recon",
        model="composer-2.5",
        tier=tier,
        prompt_tokens=p,
        cached_tokens=0,
        completion_tokens=c,
        started_at=started,
        ended_at=started + timedelta(seconds=3),
        outcome="complete",
        customer_id=CUSTOMER,
    )
    await meter.settle(admission, report)
    return admission, report


def reconcile(env: dict[str, str | None], period: str, org: str) -> Any:
    return CliRunner().invoke(billing_app, ["reconcile", "--org", org, "--period", period], env=env)


@pytest.mark.asyncio(loop_scope="session")
async def test_stripe_invoices_the_ledger_to_the_cent_through_the_billing_path(
    billing_settings: BillingSettings,
    stripe_server: Callable[..., StripeStandIn],
    ledger_url: str,
    tmp_path: Path,
) -> None:
    server = stripe_server(fail_first=2)
    org = f"org-recon-{uuid.uuid4().hex[:8]}"
    book_path = write_test_book(
        tmp_path / "recon-book.yaml", versions=VERSIONS, plans=PLANS, promotions=PROMOTIONS
    )
    settings = billing_settings.model_copy(
        update={
            "ledger_url": ledger_url,
            "pricebook_path": book_path,
            "stripe_api_base": server.base_url,
            "stripe_api_key": SecretStr("sk_test_reconcile"),
            "stripe_retry_base_s": 60,
        }
    )
    book = load_pricebook(book_path)
    engine = make_engine(ledger_url)
    migrate(engine)
    set_customers(engine, {org: CUSTOMER})
    client = redis.Redis.from_url(settings.redis_url)
    consumer = UsageStreamConsumer(client, engine, settings)
    meter = RedisMeter(settings, book=book)
    env = {
        "CSTACK_LEDGER_URL": ledger_url,
        "CSTACK_PRICEBOOK_PATH": str(book_path),
        "CSTACK_STRIPE_API_BASE": server.base_url,
        "CSTACK_STRIPE_API_KEY": "sk_test_reconcile",
    }
    try:
        for request in NOVEMBER:
            admission, report = await settle(meter, org, *request)
            if request[0] == "r2":
                # A duplicate delivery: the gateway settles twice, and the stream entry
                # is delivered again (as a reclaimed or replayed entry would be).
                await meter.settle(admission, report)
                stream = keyspace(settings).usage_stream_of(org)
                entry = client.xrange(stream)[-1][1]
                client.xadd(stream, entry)
        assert consumer.drain(max_seconds=30).inserted == len(NOVEMBER)

        # November closed an hour ago; the stand-in fails the first two posts.
        december_first = datetime(2026, 12, 1, 1, 0, 1, tzinfo=UTC)
        first = sync_stripe(engine, book, settings, december_first)
        assert (first.planned, first.sent, first.failed) == (10, 8, 2)
        failed = reconcile(env, "2026-11", org)
        assert failed.exit_code == 1, failed.output
        assert "2 planned item(s) not yet accepted by Stripe" in failed.stdout
        assert sync_stripe(engine, book, settings, december_first + timedelta(minutes=2)).sent == 2

        preview = invoice_preview(engine, book, org, "2026-11")
        assert {line.key: line.amount_cents for line in preview.lines} == {
            "fast.input.2026-10-01": 3,
            "fast.output.2026-10-01": 30,
            "fast.input.2026-11-16": 6,  # 25,000 x $2.40/1M = 6.0c
            "fast.output.2026-11-16": 84,  # 70,000 x $12/1M = 84.0c
            "standard.input.2026-10-01": 5,
            "standard.output.2026-10-01": 13,  # 12.5c, rounded once, half up
            "standard.input.2026-11-16": 1,  # 34,334 x $0.40/1M = 1.37c
            "standard.output.2026-11-16": 2,  # 8,776 x $2/1M = 1.76c
            # r5 finds $0.3341128 of allowance left, which covers twice that of its list
            # cost: the promotion's credit is $0.3341128, the rest of r5 and all of r6
            # ($0.1021728) are overage at list price.
            "promotion": -33,
            "allowance": -100,  # the whole $1.00: crossed during the promotion
        }
        agreed = reconcile(env, "2026-11", org)
        assert agreed.exit_code == 0, agreed.output
        assert "agree" in agreed.stdout
        assert stripe_total(settings, "2026-11") == preview.total_cents == 11

        # Usage that arrives after November was posted: only the lines it changes move.
        await settle(meter, org, *LATE)
        consumer.drain(max_seconds=30)
        late = sync_stripe(engine, book, settings, december_first + timedelta(hours=1))
        # Past the allowance: overage at list. fast.output.2026-11-16's item +5c; the
        # fast.input one keeps its 6c but now stands for 26,234 tokens (62,961,600 nano:
        # no longer whole cents, so an amount with the tokens in its description).
        assert (late.planned, late.sent) == (2, 2)
        assert reconcile(env, "2026-11", org).exit_code == 0
        assert (
            stripe_total(settings, "2026-11")
            == invoice_preview(engine, book, org, "2026-11").total_cents
            == 16
        )

        # December: the promotion ends on the 4th; every line rounds on its own.
        for request in DECEMBER:
            await settle(meter, org, *request)
        consumer.drain(max_seconds=30)
        sync_stripe(engine, book, settings, datetime(2027, 1, 1, 1, 0, 1, tzinfo=UTC))
        december = reconcile(env, "2026-12", org)
        assert december.exit_code == 0, december.output
        assert {
            line.key: line.amount_cents
            for line in invoice_preview(engine, book, org, "2026-12").lines
        } == {
            "fast.input.2026-11-16": 0,
            "fast.output.2026-11-16": 2,
            "standard.input.2026-11-16": 0,
            "standard.output.2026-11-16": 1,
            "promotion": -1,
            "allowance": -2,
        }
        assert stripe_total(settings, "2026-12") == 0
        # Stripe's own upcoming invoice carries both months' pending items: 16c + 0c.
        assert "Stripe's upcoming invoice for cus_recon (all pending items): $0.16" in (
            december.stdout
        )

        # Someone adds items in Stripe by hand: reconcile names the lines that differ.
        api = stripe_client(settings)
        api.v1.invoice_items.create(
            params={
                "customer": CUSTOMER,
                "amount": 25,
                "currency": "usd",
                "metadata": {
                    "cstack_org": org,
                    "cstack_period": "2026-11",
                    "cstack_line": "allowance",
                },
            }
        )
        tampered = reconcile(env, "2026-11", org)
        assert tampered.exit_code == 1
        assert tampered.stdout.strip().splitlines()[-1] == "differ: allowance (+$0.25)"
        november = datetime(2026, 11, 15, tzinfo=UTC).timestamp()
        stray = api.v1.invoice_items.create(
            params={
                "customer": CUSTOMER,
                "amount": 700,
                "currency": "usd",
                "description": "setup fee",
                "period": {"start": int(november), "end": int(november)},
            }
        )
        assert (
            f"not from the ledger: {stray.id} setup fee (+$7.00)"
            in reconcile(env, "2026-11", org).stdout
        )
        assert reconcile(env, "2026-12", org).exit_code == 0  # December is untouched
    finally:
        await meter.aclose()
        client.close()


def stripe_total(settings: BillingSettings, period: str) -> int:
    """Cents Stripe holds for the customer's period, read back through stripe-python."""
    return sum(
        item.amount_cents
        for item in list_invoice_items(stripe_client(settings), CUSTOMER)
        if item.metadata.get("cstack_period") == period
    )


def test_reconcile_refuses_bad_input_in_one_line(
    billing_settings: BillingSettings, stripe_server: Callable[..., StripeStandIn], tmp_path: Path
) -> None:
    server = stripe_server()
    book_path = write_test_book(tmp_path / "book.yaml", versions=VERSIONS, plans=PLANS)
    env = {
        "CSTACK_LEDGER_URL": billing_settings.ledger_url,
        "CSTACK_PRICEBOOK_PATH": str(book_path),
        "CSTACK_STRIPE_API_BASE": server.base_url,
        "CSTACK_STRIPE_API_KEY": "sk_test_reconcile",
    }
    for period, org, message in (
        ("2026-13", "org-recon", "error: period must look like 2026-11, got '2026-13'"),
        ("2026-11", "nobody", "error: unknown org 'nobody': the ledger has nothing for it"),
    ):
        result = reconcile(env, period, org)
        assert result.exit_code == 2
        assert result.stderr.strip() == message
    result = reconcile({**env, "CSTACK_STRIPE_API_KEY": None}, "2026-11", "org-recon")  # type: ignore[dict-item]
    assert result.exit_code == 2
    assert result.stderr.strip() == (
        "error: CSTACK_STRIPE_API_KEY is not set; cannot talk to Stripe"
    )
