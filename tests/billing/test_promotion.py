"""A promotion through admission, settlement and the ledger, whatever today's date is.

Admission prices the worst case at the moment it runs, so the test's price book has a
promotion that covers every moment the test could run (from 2000 for a million days);
settlement prices at the request's own start, so a fixed instant inside that window.
(test_stripe_reconcile.py drives a promotion that starts and ends inside the invoiced
months on to Stripe.)
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from pathlib import Path

import pytest
import redis
from sqlalchemy import select

from billing.ledger import UsageRow, make_engine, migrate
from billing.ledger.consumer import UsageStreamConsumer
from billing.ledger.invoice import invoice_preview
from billing.meter.protocol import UsageReport
from billing.meter.redis_meter import RedisMeter
from billing.prices.pricing import load_pricebook
from billing.settings import BillingSettings
from tests.support.billing import TEST_VERSIONS, write_test_book
from tests.support.builders import admission_request

STARTED = datetime(2026, 11, 20, 9, 30, tzinfo=UTC)


@pytest.mark.asyncio(loop_scope="session")
async def test_a_promotion_halves_reservation_budget_and_allowance_but_not_list_cost(
    billing_settings: BillingSettings, tmp_path: Path
) -> None:
    book_path = write_test_book(
        tmp_path / "always-promoted.yaml",
        versions=TEST_VERSIONS,
        plans={
            "promo": {
                "included_usd": "1.00",
                "overage": "refused",
                "rpm": 100000,
                "tpm": 100000000,
            }
        },
        promotions=[
            {
                "id": "always",
                "starts_at": "2000-01-01T00:00:00Z",
                "days": 1_000_000,
                "models": ["composer-2.5*"],
                "usage_multiplier": "2",
            }
        ],
    )
    settings = billing_settings.model_copy(update={"pricebook_path": book_path})
    engine = make_engine(settings.ledger_url)
    migrate(engine)
    meter = RedisMeter(settings, book=load_pricebook(book_path))
    org = f"org-promo-{uuid.uuid4().hex[:8]}"
    try:
        request = admission_request(
            org=org, plan="promo", prompt=1_000, max_output=500, customer="cus_promo"
        )
        admission = await meter.admit(request)
        worst_list = 1_000 * 3000 + 500 * 15000
        assert admission.reserved_nano_usd == worst_list // 2
        report = UsageReport(
            request_id=request.request_id,
            org_id=org,
            key_id=request.key_id,
            model=request.model,
            tier=request.tier,
            prompt_tokens=1_000,
            cached_tokens=0,
            completion_tokens=200,
            started_at=STARTED,
            ended_at=STARTED,
            outcome="complete",
            customer_id="cus_promo",
        )
        await meter.settle(admission, report)
        period = str(admission.reservation_id).split("/")[0]
        used = await meter.redis.hget(meter.keys.budget_prefix(org) + period, "used")
        list_cost = 1_000 * 3000 + 200 * 15000
        assert int(used or 0) == list_cost // 2
    finally:
        await meter.aclose()

    client = redis.Redis.from_url(settings.redis_url)
    UsageStreamConsumer(client, engine, settings).drain(max_seconds=30)
    client.close()
    with engine.connect() as connection:
        row = connection.execute(select(UsageRow).where(UsageRow.org_id == org)).one()
    assert (row.list_cost_nano_usd, row.allowance_cost_nano_usd) == (list_cost, list_cost // 2)
    assert (row.promotion_id, row.promotion_multiplier) == ("always", "2")
    lines = {
        line.key: line.amount_nano_usd
        for line in invoice_preview(engine, load_pricebook(book_path), org, "2026-11").lines
    }
    assert lines["promotion"] == -(list_cost // 2)
    assert lines["allowance"] == -(list_cost // 2)
