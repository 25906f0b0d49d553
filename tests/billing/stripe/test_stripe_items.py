"""Invoice items finance can read, against the Stripe stand-in through stripe-python: one item
per invoice line, with its tokens and unit price where Stripe can state them exactly;
changed in place while its invoice is a draft or it has none; once Stripe finalized its
invoice, a change is an adjustment item that says so; an org's new customer gets every
item that can still move; items of the previous release migrate and are resent as they
were first sent. Amounts in the comments are worked out by hand."""

from __future__ import annotations

import uuid
from collections import defaultdict
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import pytest
import stripe
from pydantic import SecretStr
from sqlalchemy import Engine, text

from billing.ledger import make_engine, migrate
from billing.ledger.invoice import invoice_preview
from billing.ledger.writes import insert_usage_events
from billing.prices.pricebook import PriceBook
from billing.prices.pricing import load_pricebook
from billing.settings import BillingSettings
from billing.stripe.api import StripeItem, list_invoice_items, stripe_client
from billing.stripe.reconcile import reconcile
from billing.stripe.sync import sync_stripe
from tests.support.billing import set_customers, write_test_book
from tests.support.builders import hand_event
from tests.support.fakes.stripe import StripeStandIn

#: November is due: it has been over for its grace hour.
DECEMBER = datetime(2026, 12, 1, 2, 0, tzinfo=UTC)
PLANS = {"none-included": {"included_usd": "0", "overage": "billed",
                           "overage_budget_usd": "100", "rpm": 10, "tpm": 10**6}}  # fmt: skip
VERSIONS = [
    {
        "version": "2026-11",
        "effective_from": "2026-11-01T00:00:00Z",
        "tiers": {
            "standard": {"input_per_1m": "0.50", "output_per_1m": "2.50"},
            "fast": {"input_per_1m": "3.00", "output_per_1m": "15.00"},
        },
    }
]


@pytest.fixture
def book(tmp_path: Path) -> PriceBook:
    return load_pricebook(write_test_book(tmp_path / "b.yaml", versions=VERSIONS, plans=PLANS))


@pytest.fixture
def ledger(ledger_url: str) -> Engine:
    engine = make_engine(ledger_url)
    migrate(engine)
    return engine


@pytest.fixture
def stand_in(
    stripe_server: Callable[..., StripeStandIn], billing_settings: BillingSettings, ledger_url: str
) -> tuple[StripeStandIn, BillingSettings]:
    server = stripe_server()
    return server, billing_settings.model_copy(
        update={
            "ledger_url": ledger_url,
            "stripe_api_base": server.base_url,
            "stripe_api_key": SecretStr("sk_test_items"),
        }
    )


def fast_output(org: str, request_id: str, tokens: int, day: int = 10) -> object:
    """``tokens`` output tokens on the fast tier: tokens x 15,000 nano-USD."""
    return hand_event(org, request_id, datetime(2026, 11, day, tzinfo=UTC), tier="fast",
                      version="2026-11", prompt=0, completion=tokens, list_cost=tokens * 15000,
                      plan="none-included")  # fmt: skip


def write(ledger: Engine, *events: object) -> None:
    with ledger.begin() as connection:
        insert_usage_events(connection, list(events))


def held(settings: BillingSettings, *customers: str) -> dict[str, list[StripeItem]]:
    """Stripe's items per line of November, read back through stripe-python."""
    lines: dict[str, list[StripeItem]] = defaultdict(list)
    for customer in customers:
        for item in list_invoice_items(stripe_client(settings), customer):
            lines[item.metadata["cstack_line"]].append(item)
    return dict(lines)


def invoice_now(settings: BillingSettings, customer: str) -> str:
    """Stripe invoices the customer's pending items: a draft, then finalized."""
    client = stripe_client(settings)
    draft = client.v1.invoices.create(
        params={"customer": customer, "pending_invoice_items_behavior": "include"}
    )
    return str(client.v1.invoices.finalize_invoice(draft.id).id)


def test_an_item_is_changed_until_its_invoice_is_final_then_adjusted(
    ledger: Engine, book: PriceBook, stand_in: tuple[StripeStandIn, BillingSettings]
) -> None:
    server, settings = stand_in
    org = f"org-items-{uuid.uuid4().hex[:6]}"
    set_customers(ledger, {org: "cus_Items"})
    write(ledger, fast_output(org, "a", 1_000))  # 15,000,000 nano-USD: 1.5c, rounds to 2c
    assert sync_stripe(ledger, book, settings, DECEMBER).sent == 1
    (item,) = held(settings, "cus_Items")["fast.output.2026-11"]
    # Not whole cents: an amount, with the tokens in the description.
    assert (item.amount_cents, item.quantity, item.unit_amount_decimal) == (2, 1, None)
    assert item.description.endswith(": 1,000 tokens")

    # Stripe drafts the invoice; usage arrives late: the item on the draft changes in place.
    client = stripe_client(settings)
    draft = client.v1.invoices.create(
        params={"customer": "cus_Items", "pending_invoice_items_behavior": "include"}
    )
    write(ledger, fast_output(org, "b", 1_000))  # 2,000 tokens: 30,000,000 = 3c exactly
    assert sync_stripe(ledger, book, settings, DECEMBER).sent == 1
    (item,) = held(settings, "cus_Items")["fast.output.2026-11"]
    assert (item.amount_cents, item.quantity, item.unit_amount_decimal) == (3, 2000, "0.0015")
    assert client.v1.invoices.retrieve(draft.id).total == 3
    client.v1.invoices.finalize_invoice(draft.id)

    # Stripe finalized it: the next change is an adjustment, said to be one.
    write(ledger, fast_output(org, "c", 3_000))  # 5,000 tokens: 75,000,000 = 7.5c -> 8c
    result = sync_stripe(ledger, book, settings, DECEMBER)
    assert (result.finalized, result.sent) == (1, 1)
    first, adjustment = sorted(held(settings, "cus_Items")["fast.output.2026-11"], key=revision)
    assert (first.amount_cents, first.invoice) == (3, draft.id)
    assert adjustment.amount_cents == 8 - 3 and adjustment.invoice is None
    assert adjustment.metadata["cstack_kind"] == "adjustment"
    assert adjustment.description == (
        "Adjustment to composer-2.5 fast output tokens @ $15.00/1M (v2026-11): +3,000 tokens"
    )
    # ... itself changed in place while it is pending.
    write(ledger, fast_output(org, "d", 1_000))  # 6,000 tokens: 90,000,000 = 9c
    assert sync_stripe(ledger, book, settings, DECEMBER).sent == 1
    first, adjustment = sorted(held(settings, "cus_Items")["fast.output.2026-11"], key=revision)
    assert adjustment.amount_cents == 9 - 3
    assert adjustment.description.endswith(": +4,000 tokens")
    # Nothing was ever sent to an item on a finalized invoice.
    assert "invalid" not in [r["result"] for r in server.requests()]
    assert reconcile(ledger, book, stripe_client(settings), org, "2026-11").agree
    assert invoice_preview(ledger, book, org, "2026-11").total_cents == 9


def revision(item: StripeItem) -> int:
    return int(item.metadata["cstack_revision"])


def test_a_new_customer_gets_every_item_that_can_still_move(
    ledger: Engine, book: PriceBook, stand_in: tuple[StripeStandIn, BillingSettings]
) -> None:
    _, settings = stand_in
    org = f"org-move-{uuid.uuid4().hex[:6]}"
    set_customers(ledger, {org: "cus_Old"})
    standard_input = hand_event(org, "s", datetime(2026, 11, 3, tzinfo=UTC), tier="standard",
                                version="2026-11", prompt=40_000, completion=0,
                                list_cost=40_000 * 500, plan="none-included")  # fmt: skip
    write(ledger, fast_output(org, "a", 2_000), standard_input)  # 3c and 2c
    sync_stripe(ledger, book, settings, DECEMBER)
    invoice_now(settings, "cus_Old")  # both items billed at the old customer
    write(ledger, fast_output(org, "b", 2_000))  # +3c: an adjustment, pending at cus_Old
    sync_stripe(ledger, book, settings, DECEMBER)
    assert [i.amount_cents for i in held(settings, "cus_Old")["fast.output.2026-11"]] == [3, 3]

    set_customers(ledger, {org: "cus_New"})
    write(ledger, fast_output(org, "c", 2_000, day=20))  # +3c more
    sync_stripe(ledger, book, settings, DECEMBER)
    old, new = held(settings, "cus_Old"), held(settings, "cus_New")
    # The invoiced items stay where they were billed; the pending adjustment moved.
    assert [i.amount_cents for i in old["fast.output.2026-11"]] == [3]
    assert [i.amount_cents for i in new["fast.output.2026-11"]] == [6]
    assert [i.amount_cents for i in old["standard.input.2026-11"]] == [2]
    assert "standard.input.2026-11" not in new
    result = reconcile(ledger, book, stripe_client(settings), org, "2026-11")
    assert result.agree and set(result.customers) == {"cus_Old", "cus_New"}


def test_items_of_the_previous_release_migrate_and_resend_as_first_sent(
    ledger_url: str, book: PriceBook, stand_in: tuple[StripeStandIn, BillingSettings]
) -> None:
    """That release posted each change of a line as another amount-only item."""
    server, settings = stand_in
    org = f"org-old-{uuid.uuid4().hex[:6]}"
    engine = make_engine(ledger_url)
    migrate(engine, "0006")
    client = stripe_client(settings)
    november = {"start": int(datetime(2026, 11, 1, tzinfo=UTC).timestamp()),
                "end": int(datetime(2026, 12, 1, tzinfo=UTC).timestamp()) - 1}  # fmt: skip
    posted: dict[int, str] = {}
    for rev, cents in ((1, 2), (2, 1), (3, 1)):  # 2c, then +1c, then +1c not yet committed
        key = f"cstack.{org}.2026-11.fast.output.2026-11.{rev}"
        meta = {"cstack_org": org, "cstack_period": "2026-11",
                "cstack_line": "fast.output.2026-11", "cstack_revision": str(rev)}  # fmt: skip
        params = {"customer": "cus_Old", "amount": cents, "currency": "usd",
                  "description": "composer-2.5 fast output tokens @ $15.00/1M (v2026-11)",
                  "metadata": meta, "period": november}  # fmt: skip
        posted[rev] = str(
            client.v1.invoice_items.create(params=params, options={"idempotency_key": key}).id
        )
        with engine.begin() as connection:
            connection.execute(
                text(
                    "INSERT INTO stripe_invoice_items (org_id, period, line_key, revision, "
                    "customer_id, amount_cents, description, idempotency_key, status, "
                    "attempts, next_attempt_at, first_attempt_at, stripe_item_id, created_at) "
                    "VALUES (:org, '2026-11', 'fast.output.2026-11', :rev, 'cus_Old', :cents, "
                    ":description, :key, :status, 1, :at, :at, :item, :at)"
                ),
                {"org": org, "rev": rev, "cents": cents, "description": params["description"],
                 "key": key, "status": "pending" if rev == 3 else "sent",
                 "item": None if rev == 3 else posted[rev], "at": DECEMBER.replace(tzinfo=None)},
            )  # fmt: skip
    with engine.begin() as connection:
        connection.execute(
            text(
                "INSERT INTO usage_events (event_id, org_id, key_id, plan, model, tier, "
                "prompt_tokens, cached_tokens, completion_tokens, list_cost_nano_usd, "
                "allowance_cost_nano_usd, promotion_multiplier, price_version, started_at, "
                "ended_at, outcome, recorded_at) VALUES (:id, :org, 'k', 'none-included', "
                "'composer-2.5', 'fast', 0, 0, 3000, 45000000, 45000000, '1', '2026-11', :at, :at, "
                "'complete', :at)"
            ),
            {"id": f"{org}-old", "org": org, "at": datetime(2026, 11, 5)},
        )
        connection.execute(
            text("INSERT INTO stripe_invoice_changes VALUES (:org, '2026-11', 1)"), {"org": org}
        )
    migrate(engine)
    set_customers(engine, {org: "cus_Old"})
    # The item the crash left uncommitted is replayed by Stripe, not posted twice.
    assert sync_stripe(engine, book, settings, DECEMBER).failed == 0
    replays = [r for r in server.requests() if r["result"] == "replayed"]
    assert [r["idempotency_key"] for r in replays] == [
        f"cstack.{org}.2026-11.fast.output.2026-11.3"
    ]
    # 3,000 tokens: 45,000,000 nano-USD = 4.5c -> 5c; 2 + 1 stand, the last item is 2c now.
    items = sorted(held(settings, "cus_Old")["fast.output.2026-11"], key=revision)
    assert [i.amount_cents for i in items] == [2, 1, 2]
    assert [i.id for i in items] == [posted[1], posted[2], posted[3]]
    assert reconcile(engine, book, client, org, "2026-11").agree


def test_the_stand_in_refuses_changes_on_a_finalized_invoice_as_stripe_does(
    stand_in: tuple[StripeStandIn, BillingSettings],
) -> None:
    _, settings = stand_in
    client = stripe_client(settings)
    item = client.v1.invoice_items.create(
        params={
            "customer": "cus_Rules",
            "quantity": 3,
            "unit_amount_decimal": "0.5",
            "currency": "usd",
        }
    )
    assert (item.amount, item.quantity) == (2, 3)  # 1.5c: Stripe rounds, billing avoids it
    with pytest.raises(stripe.InvalidRequestError):
        client.v1.invoice_items.create(
            params={"customer": "cus_Rules", "amount": 5, "unit_amount_decimal": "1"}
        )
    spare = client.v1.invoice_items.create(params={"customer": "cus_Rules", "amount": 4})
    invoice = invoice_now(settings, "cus_Rules")
    with pytest.raises(stripe.InvalidRequestError):
        client.v1.invoice_items.update(item.id, params={"amount": 1})
    with pytest.raises(stripe.InvalidRequestError):
        client.v1.invoice_items.delete(spare.id)
    with pytest.raises(stripe.InvalidRequestError):
        client.v1.invoices.finalize_invoice(invoice)
    final = client.v1.invoices.retrieve(invoice)
    assert (final.status, final.total, final.amount_due) == ("open", 6, 6)
    pending = client.v1.invoice_items.create(params={"customer": "cus_Rules", "amount": 7})
    client.v1.invoice_items.delete(pending.id)
    with pytest.raises(stripe.InvalidRequestError):
        client.v1.invoice_items.retrieve(pending.id)
