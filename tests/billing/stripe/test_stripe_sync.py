"""Ledger -> Stripe invoice items against the local Stripe stand-in (a real HTTP server
process driven by stripe-python): an item per invoice line, to the cent, posted once
across injected failures, lost commits and resends after Stripe forgot the idempotency
key; late usage updates its line's item in place, and a write racing the planner keeps
its period queued. (test_stripe_items.py: finalized invoices, adjustments, customers.)"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import stripe
from prometheus_client import REGISTRY
from pydantic import SecretStr
from sqlalchemy import Engine, func, select, update

from billing.ledger import InvoiceChange, StripeInvoiceItem, make_engine, migrate
from billing.ledger.invoice import invoice_preview
from billing.ledger.writes import add_adjustment, insert_usage_events
from billing.meter.events import UsageEvent
from billing.prices.pricebook import PriceBook
from billing.prices.pricing import charge, load_pricebook
from billing.settings import BillingSettings
from billing.stripe import items as stripe_items
from billing.stripe.api import (
    create_invoice_item,
    list_invoice_items,
    service_period,
    stripe_client,
    upcoming_invoice_total,
)
from billing.stripe.sync import idempotency_key, sync_stripe
from tests.support.billing import set_customers, write_test_book
from tests.support.fakes.stripe import StripeStandIn

#: November is due once it has been over for the grace period (an hour).
NOW = datetime(2026, 12, 1, 1, 0, 30, tzinfo=UTC)
TIERS = {
    "standard": {"input_per_1m": "0.50", "output_per_1m": "2.50"},
    "fast": {"input_per_1m": "3.00", "output_per_1m": "15.00"},
}
SMALL = {"included_usd": "0.01", "overage": "billed", "overage_budget_usd": "100.00"}


@pytest.fixture
def book(tmp_path: Path) -> PriceBook:
    path = write_test_book(
        tmp_path / "sync-book.yaml",
        versions=[
            {"version": "2026-11-01", "effective_from": "2026-11-01T00:00:00Z", "tiers": TIERS}
        ],
        plans={"small": {**SMALL, "rpm": 1000, "tpm": 10**8}},
    )
    return load_pricebook(path)


def usage(
    book: PriceBook,
    event_id: str,
    at: datetime,
    *,
    org: str,
    customer: str | None,
    tier: str = "fast",
    prompt: int = 0,
    completion: int = 0,
) -> UsageEvent:
    """A usage event priced by the real pricing code, as settlement prices it."""
    priced = charge(
        book,
        tier=tier,  # type: ignore[arg-type]
        model="composer-2.5",
        prompt_tokens=prompt,
        cached_tokens=0,
        completion_tokens=completion,
        at=at,
    )
    return UsageEvent(
        event_id=event_id,
        org_id=org,
        key_id="key-1",
        customer_id=customer,
        plan="small",
        model="composer-2.5",
        tier=tier,  # type: ignore[arg-type]
        prompt_tokens=prompt,
        cached_tokens=0,
        completion_tokens=completion,
        list_cost_nano_usd=priced.list_cost_nano,
        allowance_cost_nano_usd=priced.allowance_cost_nano,
        promotion_multiplier=str(priced.usage_multiplier),
        promotion_id=priced.promotion_id,
        price_version=priced.price_version,
        started_at=at,
        ended_at=at,
        outcome="complete",
    )


def nov(day: int) -> datetime:
    return datetime(2026, 11, day, 12, 0, tzinfo=UTC)


def ledger_with_usage(url: str, book: PriceBook) -> Engine:
    engine = make_engine(url)
    migrate(engine)
    with engine.begin() as connection:
        insert_usage_events(
            connection,
            [
                # org-a: fast 30c + 15c, standard 10c + 7.5c (rounds to 8c), allowance -1c.
                usage(book, "a1", nov(3), org="org-a", customer="cus_A", prompt=100_000),
                usage(book, "a2", nov(3), org="org-a", customer="cus_A", completion=10_000),
                usage(
                    book, "a3", nov(4), org="org-a", customer="cus_A", tier="standard",
                    prompt=200_000, completion=30_000,
                ),
                # org-b: fast 3c + 1.5c (2c), allowance -1c.
                usage(
                    book, "b1", nov(5), org="org-b", customer="cus_B", prompt=10_000,
                    completion=1_000,
                ),
                # No Stripe customer: billed elsewhere, never posted.
                usage(book, "c1", nov(5), org="org-c", customer=None, prompt=10_000),
                # December is still open at NOW: posted once it closes.
                usage(
                    book, "a-dec", datetime(2026, 12, 1, 0, 30, tzinfo=UTC), org="org-a",
                    customer="cus_A", prompt=100_000,
                ),
            ],
        )  # fmt: skip
    # org-c has no Stripe customer: its month is never posted.
    set_customers(engine, {"org-a": "cus_A", "org-b": "cus_B"})
    return engine


def settings_for(base: BillingSettings, server: StripeStandIn, ledger_url: str) -> BillingSettings:
    return base.model_copy(
        update={
            "ledger_url": ledger_url,
            "stripe_api_base": server.base_url,
            "stripe_api_key": SecretStr("sk_test_billing"),
            "stripe_retry_base_s": 60,
        }
    )


def stripe_lines(settings: BillingSettings, *customers: str) -> dict[tuple[str, str, str], int]:
    """What Stripe holds, read back through stripe-python: cents per (org, period, line)."""
    client = stripe_client(settings)
    totals: dict[tuple[str, str, str], int] = defaultdict(int)
    for customer in customers:
        for item in list_invoice_items(client, customer):
            meta = item.metadata
            totals[(meta["cstack_org"], meta["cstack_period"], meta["cstack_line"])] += (
                item.amount_cents
            )
    return dict(totals)


def ledger_lines(engine: Engine, book: PriceBook, *orgs: str, period: str = "2026-11") -> dict:  # type: ignore[type-arg]
    """The ledger's invoice lines in cents; lines that round to zero need no item."""
    return {
        (org, period, line.key): line.amount_cents
        for org in orgs
        for line in invoice_preview(engine, book, org, period).lines
        if line.amount_cents
    }


def test_invoice_items_mirror_the_ledger_once_across_failures_and_lost_commits(
    billing_settings: BillingSettings,
    stripe_server: Callable[..., StripeStandIn],
    ledger_url: str,
    book: PriceBook,
) -> None:
    server = stripe_server(fail_first=2)
    settings = settings_for(billing_settings, server, ledger_url)
    engine = ledger_with_usage(ledger_url, book)

    result = sync_stripe(engine, book, settings, NOW)
    # 5 items for org-a, 3 for org-b, none for org-c; the stand-in failed the first two.
    assert (result.planned, result.sent, result.failed) == (8, 6, 2)
    with engine.connect() as connection:
        waiting = connection.execute(
            select(StripeInvoiceItem.attempts, StripeInvoiceItem.next_attempt_at).where(
                StripeInvoiceItem.status == "pending"
            )
        ).all()
        queued = connection.execute(select(InvoiceChange.org_id, InvoiceChange.period)).all()
    assert [tuple(w) for w in waiting] == [(1, NOW + timedelta(seconds=60))] * 2
    # org-c has no Stripe customer: its month waits for one, counted by a metric.
    assert sorted(tuple(q) for q in queued) == [("org-a", "2026-12"), ("org-c", "2026-11")]
    assert REGISTRY.get_sample_value("cstack_orgs_without_stripe_customer") == 1
    assert sync_stripe(engine, book, settings, NOW + timedelta(seconds=30)).sent == 0  # backoff
    assert sync_stripe(engine, book, settings, NOW + timedelta(seconds=61)).sent == 2

    expected = ledger_lines(engine, book, "org-a", "org-b")
    assert stripe_lines(settings, "cus_A", "cus_B") == expected
    assert expected[("org-a", "2026-11", "standard.output.2026-11-01")] == 8
    assert (
        sum(expected.values())
        == invoice_preview(engine, book, "org-a", "2026-11").total_cents
        + invoice_preview(engine, book, "org-b", "2026-11").total_cents
    )
    for record in server.accepted():
        meta = record["metadata"]
        assert record["idempotency_key"] == idempotency_key(
            meta["cstack_org"], meta["cstack_period"], meta["cstack_line"], 1
        )

    # A worker that crashed after Stripe answered but before its commit resends: the same
    # idempotency key replays Stripe's first answer instead of adding an item.
    with engine.begin() as connection:
        connection.execute(
            update(StripeInvoiceItem).values(
                status="pending", stripe_item_id=None, stripe_state=None
            )
        )
    assert sync_stripe(engine, book, settings, NOW + timedelta(seconds=62)).sent == 8
    assert server.results().count("replayed") == 8
    assert len(server.accepted()) == 8

    # Usage that arrives late for the closed month changes its line's item in place; a
    # credit is a line of its own.
    with engine.begin() as connection:
        insert_usage_events(
            connection,
            [usage(book, "b-late", nov(30), org="org-b", customer="cus_B", completion=3_000)],
        )
        add_adjustment(
            connection,
            adjustment_id="goodwill-a",
            org_id="org-a",
            tier="fast",
            list_cost_delta_nano_usd=-50_000_000,
            reason="goodwill credit",
            effective_at=nov(15),
        )
    later = NOW + timedelta(minutes=5)
    assert sync_stripe(engine, book, settings, later).sent == 2
    assert stripe_lines(settings, "cus_A", "cus_B") == ledger_lines(engine, book, "org-a", "org-b")
    created = [r for r in server.accepted() if r["method"] == "POST"]
    assert [(r["metadata"]["cstack_line"], r["amount"]) for r in created][-1] == (
        "adjustments",
        "-5",
    )
    (changed,) = [r for r in server.requests() if r["path"].startswith("/v1/invoiceitems/")
                  and r["method"] == "POST"]  # fmt: skip
    # b1's 1,000 output tokens (1.5c) and b-late's 3,000 (4.5c): 6c, one item, updated.
    assert (changed["quantity"], changed["unit_amount_decimal"]) == ("4000", "0.0015")
    assert len(stripe_client(settings).v1.invoice_items.list({"customer": "cus_B"}).data) == 3
    assert sync_stripe(engine, book, settings, later + timedelta(minutes=5)).planned == 0

    # December, once closed.
    january = datetime(2027, 1, 1, 1, 0, 1, tzinfo=UTC)
    assert sync_stripe(engine, book, settings, january).sent == 2
    assert stripe_lines(settings, "cus_A") == {
        **ledger_lines(engine, book, "org-a"),
        **ledger_lines(engine, book, "org-a", period="2026-12"),
    }


def test_a_resend_after_stripes_idempotency_window_looks_before_posting(
    billing_settings: BillingSettings,
    stripe_server: Callable[..., StripeStandIn],
    ledger_url: str,
    book: PriceBook,
) -> None:
    server = stripe_server()
    settings = settings_for(billing_settings, server, ledger_url)
    engine = ledger_with_usage(ledger_url, book)
    assert sync_stripe(engine, book, settings, NOW).sent == 8
    with engine.connect() as connection:
        before = dict(
            connection.execute(select(StripeInvoiceItem.id, StripeInvoiceItem.stripe_item_id)).all()
        )
    # The worker posted, lost the answer, and was down for two days: Stripe has forgotten
    # the key by now, so only looking can tell that the items already exist.
    with engine.begin() as connection:
        connection.execute(update(StripeInvoiceItem).values(status="pending"))
    two_days = NOW + timedelta(days=2)
    assert sync_stripe(engine, book, settings, two_days).sent == 8
    assert len(server.accepted()) == 8
    assert "replayed" not in server.results()
    with engine.connect() as connection:
        after = dict(
            connection.execute(select(StripeInvoiceItem.id, StripeInvoiceItem.stripe_item_id)).all()
        )
    assert after == before


def test_a_write_racing_the_planner_keeps_the_period_queued(
    billing_settings: BillingSettings,
    stripe_server: Callable[..., StripeStandIn],
    ledger_url: str,
    book: PriceBook,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    server = stripe_server()
    settings = settings_for(billing_settings, server, ledger_url)
    engine = ledger_with_usage(ledger_url, book)
    read_invoice = stripe_items.read_invoice
    raced: list[str] = []

    def read_then_race(connection, book, org_id, period):  # type: ignore[no-untyped-def]
        invoice = read_invoice(connection, book, org_id, period)
        if org_id == "org-b" and not raced:
            # Another worker commits usage after the planner has read the ledger.
            with engine.begin() as writer:
                insert_usage_events(
                    writer,
                    [usage(book, "b-race", nov(9), org="org-b", customer="cus_B", prompt=90_000)],
                )
            raced.append(org_id)
        return invoice

    monkeypatch.setattr(stripe_items, "read_invoice", read_then_race)
    sync_stripe(engine, book, settings, NOW)
    assert stripe_lines(settings, "cus_B") != ledger_lines(engine, book, "org-b")
    with engine.connect() as connection:
        still_queued = connection.execute(
            select(func.count())
            .select_from(InvoiceChange)
            .where(InvoiceChange.org_id == "org-b", InvoiceChange.period == "2026-11")
        ).scalar_one()
    assert still_queued == 1
    sync_stripe(engine, book, settings, NOW + timedelta(seconds=1))
    assert stripe_lines(settings, "cus_B") == ledger_lines(engine, book, "org-b")


def test_open_periods_are_posted_only_when_asked(
    billing_settings: BillingSettings,
    stripe_server: Callable[..., StripeStandIn],
    ledger_url: str,
    book: PriceBook,
) -> None:
    server = stripe_server()
    settings = settings_for(billing_settings, server, ledger_url)
    engine = ledger_with_usage(ledger_url, book)
    # Still inside November's grace hour: nothing is due.
    assert (
        sync_stripe(engine, book, settings, datetime(2026, 12, 1, 0, 59, tzinfo=UTC)).planned == 0
    )
    eager = settings.model_copy(update={"stripe_post_open_periods": True})
    assert sync_stripe(engine, book, eager, datetime(2026, 12, 1, 0, 59, tzinfo=UTC)).sent == 10
    assert stripe_lines(settings, "cus_A", "cus_B") == {
        **ledger_lines(engine, book, "org-a", "org-b"),
        **ledger_lines(engine, book, "org-a", period="2026-12"),
    }


def test_idempotency_keys_fit_stripes_limit() -> None:
    assert idempotency_key("acme", "2026-11", "fast.output.2026-11-01", 3) == (
        "cstack.acme.2026-11.fast.output.2026-11-01.3"
    )
    long = idempotency_key("o" * 200, "2026-11", "fast.output.2026-11-01", 1)
    assert len(long) <= 255
    assert long != idempotency_key("o" * 200, "2026-11", "fast.output.2026-11-01", 2)


def test_the_stand_in_pages_replays_and_refuses_keys_as_stripe_does(
    billing_settings: BillingSettings, stripe_server: Callable[..., StripeStandIn]
) -> None:
    """The Stripe behaviour the sync and reconcile rely on, through stripe-python."""
    server = stripe_server()
    client = stripe_client(settings_for(billing_settings, server, billing_settings.ledger_url))
    november = (nov(1), datetime(2026, 12, 1, tzinfo=UTC))

    def post(amount: int, key: str) -> str:
        params = {
            "customer": "cus_pages",
            "amount": amount,
            "currency": "usd",
            "description": "line",
            "metadata": {"cstack_line": "x"},
            "period": service_period(*november),
        }
        return create_invoice_item(client, params, key)

    assert upcoming_invoice_total(client, "cus_pages") is None  # nothing pending yet
    ids = [post(n, f"key-{n}") for n in range(230)]
    # A resend with the same key is the same item; the key with other parameters is refused.
    assert post(7, "key-7") == ids[7]
    with pytest.raises(stripe.IdempotencyError):
        post(8, "key-7")
    listed = list_invoice_items(client, "cus_pages")
    assert [item.id for item in listed] == ids[::-1]  # every page, newest first
    assert listed[0].period_start == int(november[0].timestamp())
    pages = [r for r in server.requests() if r["method"] == "GET"]
    assert [("starting_after" in page) for page in pages] == [False, True, True]
    assert upcoming_invoice_total(client, "cus_pages") == sum(range(230))
    stranger = stripe.StripeClient(
        "sk_live_not_ours", base_addresses={"api": server.base_url}, max_network_retries=0
    )
    with pytest.raises(stripe.AuthenticationError):
        list_invoice_items(stranger, "cus_pages")
