"""The promotion rule, with every amount worked out by hand: a promotion multiplies the
plan's allowance (usage counts 1/m against it) and nothing else; overage is at list price,
taken in the order requests started, the crossing request split.

One month on SQLite and PostgreSQL with a promotion that starts and ends inside it, two
price versions, both tiers, cached input, and a late request that started before the
others: the invoice, ``GET /v1/usage``'s figures and each request's split follow the
rule. Redis's budget (admission) applies the same rule in settlement order; its Lua is
checked against the Python rule, and admission against a plan that refuses overage.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from fractions import Fraction
from pathlib import Path

import pytest
import redis
from sqlalchemy import Engine, select

from billing.allowance import Split, budget_units, month_allowance, split
from billing.ledger import UsageRow, make_engine, migrate
from billing.ledger.invoice import invoice_preview
from billing.ledger.summary import usage_summary
from billing.ledger.writes import add_adjustment, insert_usage_events
from billing.meter.events import UsageEvent
from billing.meter.protocol import AdmissionRefused, UsageReport
from billing.meter.redis_meter import RedisMeter
from billing.meter.scripts import BUDGET_UNITS
from billing.prices.pricebook import PriceBook
from billing.prices.pricing import load_pricebook
from billing.settings import BillingSettings
from tests.support.billing import write_test_book
from tests.support.builders import admission_request, hand_event

VERSIONS = [
    {
        "version": "v1",
        "effective_from": "2026-11-01T00:00:00Z",
        "tiers": {
            "standard": {"input_per_1m": "0.50", "output_per_1m": "2.50"},
            "fast": {"input_per_1m": "3.00", "output_per_1m": "15.00"},
        },
    },
    {
        "version": "v2",
        "effective_from": "2026-11-16T00:00:00Z",
        "tiers": {
            "standard": {"input_per_1m": "0.40", "output_per_1m": "2.00"},
            "fast": {
                "input_per_1m": "2.40",
                "cached_input_per_1m": "0.30",
                "output_per_1m": "12.00",
            },
        },
    },
]
#: $0.10 included (100,000,000 nano-USD), then overage at list price.
PLANS = {
    "hand": {
        "included_usd": "0.10",
        "overage": "billed",
        "overage_budget_usd": "10.00",
        "rpm": 100000,
        "tpm": 100000000,
    }
}
#: Usage counts half against the allowance from 11-10 00:00 to 11-13 00:00.
PROMOTIONS = [
    {
        "id": "mid-month",
        "starts_at": "2026-11-10T00:00:00Z",
        "days": 3,
        "models": ["composer-2.5*"],
        "usage_multiplier": "2",
    }
]


def at(day: int, hour: int = 12) -> datetime:
    return datetime(2026, 11, day, hour, 0, tzinfo=UTC)


# Each request priced by hand: (id, start, tier, version, prompt, cached, completion,
# list cost, multiplier). Fast v1 has no cached price of its own (the input price).
Q1 = ("q1", at(5), "fast", "v1", 10_000, 0, 2_000, 10_000 * 3000 + 2_000 * 15000, "1")
Q2 = ("q2", at(10, 9), "standard", "v1", 20_000, 0, 8_000, 20_000 * 500 + 8_000 * 2500, "2")
Q3 = ("q3", at(11, 10), "fast", "v1", 8_000, 4_000, 3_000, 8_000 * 3000 + 3_000 * 15000, "2")
Q4 = ("q4", at(12), "standard", "v1", 1_000, 0, 1_000, 1_000 * 500 + 1_000 * 2500, "2")
Q5 = ("q5", at(20), "fast", "v2", 5_000, 2_000, 1_000, 3_000 * 2400 + 2_000 * 300 + 12_000_000, "1")
Q6 = ("q6", at(21), "standard", "v2", 3_333, 0, 777, 3_333 * 400 + 777 * 2000, "1")
#: Started before the promotion, written after everything else.
LATE = ("q7", at(9, 23), "fast", "v1", 1_000, 0, 1_000, 1_000 * 3000 + 1_000 * 15000, "1")


def event(org: str, row: tuple[object, ...]) -> UsageEvent:
    request_id, started, tier, version, prompt, cached, completion, list_cost, m = row
    return hand_event(
        org,
        str(request_id),
        started,  # type: ignore[arg-type]
        tier=str(tier),
        version=str(version),
        prompt=prompt,  # type: ignore[arg-type]
        cached=cached,  # type: ignore[arg-type]
        completion=completion,  # type: ignore[arg-type]
        list_cost=list_cost,  # type: ignore[arg-type]
        multiplier=str(m),
    )


@pytest.fixture
def book(tmp_path: Path) -> PriceBook:
    path = tmp_path / "hand.yaml"
    return load_pricebook(
        write_test_book(path, versions=VERSIONS, plans=PLANS, promotions=PROMOTIONS)
    )


@pytest.fixture
def ledger(ledger_url: str) -> Engine:
    engine = make_engine(ledger_url)
    migrate(engine)
    return engine


def test_one_request_splits_as_the_rule_says() -> None:
    assert split(1_000, 500, Fraction(2), left=10_000) == Split(500, 1_000, 0)
    crossing = split(1_000, 500, Fraction(2), left=200)
    assert crossing == Split(200, 400, 600)
    assert crossing.promotion_credit_nano == 200
    assert split(1_000, 500, Fraction(2), left=0).overage_nano == 1_000
    # 101 left at 3/2 covers 151.5 of list: the half nano-USD goes the customer's way.
    odd = split(300, 200, Fraction(3, 2), left=101)
    assert (odd.allowance_nano, odd.covered_nano, odd.overage_nano) == (101, 152, 148)
    # In Redis: allowance consumed plus overage at list.
    assert budget_units(300, Fraction(3, 2), included=1_000, used=899) == 101 + 148
    assert budget_units(300, Fraction(3, 2), included=1_000, used=0) == 200
    assert budget_units(300, Fraction(3, 2), included=1_000, used=1_000) == 300


def test_a_month_with_a_promotion_two_versions_and_late_usage(
    ledger: Engine, book: PriceBook
) -> None:
    org = f"org-hand-{uuid.uuid4().hex[:6]}"
    with ledger.begin() as connection:
        insert_usage_events(connection, [event(org, r) for r in (Q1, Q2, Q3, Q4, Q5, Q6)])
    # q1 takes 60,000,000 of the 100,000,000; q2 (promotion) 15,000,000 for 30,000,000 of
    # list; q3 (promotion: 69,000,000 of list, 34,500,000 of allowance) finds 25,000,000
    # left: it covers 50,000,000 and 19,000,000 is overage; q4, q5, q6 are overage.
    overage = 19_000_000 + 3_000_000 + 19_800_000 + 2_887_200
    lines = invoice_lines(ledger, book, org)
    assert lines["promotion"] == -(30_000_000 - 15_000_000 + 50_000_000 - 25_000_000)
    assert lines["allowance"] == -100_000_000
    assert sum(lines.values()) == overage

    # q7 started on the 9th, before the promotion, and reaches the ledger last: it takes
    # 18,000,000 ahead of q2, so q3 finds 7,000,000 left, covers 14,000,000 of its list
    # and 55,000,000 of it is overage.
    with ledger.begin() as connection:
        insert_usage_events(connection, [event(org, LATE)])
    lines = invoice_lines(ledger, book, org)
    assert lines == {
        "fast.input.v1": (10_000 + 4_000 + 1_000) * 3000,
        "fast.cached_input.v1": 4_000 * 3000,
        "fast.output.v1": (2_000 + 3_000 + 1_000) * 15000,
        "standard.input.v1": 21_000 * 500,
        "standard.output.v1": 9_000 * 2500,
        "fast.input.v2": 3_000 * 2400,
        "fast.cached_input.v2": 2_000 * 300,
        "fast.output.v2": 1_000 * 12000,
        "standard.input.v2": 3_333 * 400,
        "standard.output.v2": 777 * 2000,
        "promotion": -(30_000_000 - 15_000_000 + 14_000_000 - 7_000_000),
        "allowance": -100_000_000,
    }
    overage = 55_000_000 + 3_000_000 + 19_800_000 + 2_887_200
    assert sum(lines.values()) == overage
    preview = invoice_preview(ledger, book, org, "2026-11")
    # Each line rounded once: 5 + 1 + 9 + 1 + 2 + 1 + 0 + 1 + 0 + 0 - 2 - 10 cents.
    assert preview.total_cents == 8

    # Each request's own split, as its receipt shows it.
    with ledger.connect() as connection:
        month = month_allowance(connection, book, org, "2026-11")
        rows = connection.execute(select(UsageRow).where(UsageRow.org_id == org)).all()
    splits = {
        row.event_id.rsplit("-", 1)[1]: month.split_of(
            row.started_at, row.id, row.list_cost_nano_usd, row.allowance_cost_nano_usd
        )
        for row in rows
    }
    assert {k: (s.allowance_nano, s.covered_nano, s.overage_nano) for k, s in splits.items()} == {
        "q1": (60_000_000, 60_000_000, 0),
        "q7": (18_000_000, 18_000_000, 0),
        "q2": (15_000_000, 30_000_000, 0),
        "q3": (7_000_000, 14_000_000, 55_000_000),
        "q4": (0, 0, 3_000_000),
        "q5": (0, 0, 19_800_000),
        "q6": (0, 0, 2_887_200),
    }

    # GET /v1/usage says the same, by day and tier.
    summary = usage_summary(ledger, book, org, at(1).date(), at(30).date())
    totals = summary["totals"]
    assert totals["list_cost_nano_usd"] == 202_687_200
    assert totals["allowance_used_nano_usd"] == 100_000_000
    assert totals["promotion_savings_nano_usd"] == 22_000_000
    assert totals["overage_nano_usd"] == overage
    day = {(d["date"], d["tier"]): d for d in summary["data"]}
    assert day[("2026-11-11", "fast")]["overage_nano_usd"] == 55_000_000
    assert day[("2026-11-11", "fast")]["promotion_savings_nano_usd"] == 7_000_000
    assert day[("2026-11-10", "standard")]["allowance_used_nano_usd"] == 15_000_000
    # A window that shows part of the month still splits the whole month.
    part = usage_summary(ledger, book, org, at(11).date(), at(11).date())["totals"]
    assert (part["allowance_used_nano_usd"], part["overage_nano_usd"]) == (7_000_000, 55_000_000)


def test_adjustments_are_outside_the_allowance(ledger: Engine, book: PriceBook) -> None:
    org = f"org-adjusted-{uuid.uuid4().hex[:6]}"
    with ledger.begin() as connection:
        insert_usage_events(connection, [event(org, Q1)])
        add_adjustment(
            connection,
            adjustment_id=f"{org}-goodwill",
            org_id=org,
            tier="fast",
            list_cost_delta_nano_usd=-5_000_000,
            reason="goodwill credit",
            effective_at=at(6),
        )
    lines = invoice_lines(ledger, book, org)
    # q1 is inside the allowance (60,000,000 of 100,000,000): only the credit is due.
    assert lines["allowance"] == -60_000_000
    assert lines["adjustments"] == -5_000_000
    assert sum(lines.values()) == -5_000_000
    summary = usage_summary(ledger, book, org, at(1).date(), at(30).date())
    assert summary["totals"]["adjustments_nano_usd"] == -5_000_000


def invoice_lines(ledger: Engine, book: PriceBook, org: str) -> dict[str, int]:
    return {
        line.key: line.amount_nano_usd
        for line in invoice_preview(ledger, book, org, "2026-11").lines
    }


def test_redis_applies_the_same_rule(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    script = client.register_script(
        BUDGET_UNITS + "return budget_units(tonumber(ARGV[1]), tonumber(ARGV[2]), "
        "tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5]))"
    )
    cases = [
        (list_cost, multiplier, included, used)
        for list_cost in (0, 3, 300, 69_000_000, 10**13)
        for multiplier in (Fraction(1), Fraction(2), Fraction(3, 2))
        for included in (0, 1, 101, 100_000_000, 5 * 10**13)
        for used in (0, 1, 99, 100_000_000 - 1, 5 * 10**13 + 7)
        if list_cost * multiplier.denominator % multiplier.numerator == 0
    ]
    for list_cost, multiplier, included, used in cases:
        in_redis = script(
            args=[list_cost, multiplier.numerator, multiplier.denominator, included, used]
        )
        assert in_redis == budget_units(list_cost, multiplier, included, used), (
            list_cost,
            multiplier,
            included,
            used,
        )
    client.close()


@pytest.mark.asyncio(loop_scope="session")
async def test_admission_counts_the_allowance_at_half_and_overage_at_list(
    billing_settings: BillingSettings, tmp_path: Path
) -> None:
    path = write_test_book(
        tmp_path / "always.yaml",
        versions=VERSIONS[:1],
        plans={
            "allowance-only": {
                "included_usd": "1.00",
                "overage": "refused",
                "rpm": 100000,
                "tpm": 100000000,
            }
        },
        promotions=[{**PROMOTIONS[0], "starts_at": "2000-01-01T00:00:00Z", "days": 1_000_000}],
    )
    settings = billing_settings.model_copy(update={"pricebook_path": path})
    meter = RedisMeter(settings, book=load_pricebook(path))
    org = f"org-half-{uuid.uuid4().hex[:8]}"
    try:
        # $1.50 of list at worst counts $0.75 against the $1.00 allowance: admitted.
        big = admission_request(org=org, plan="allowance-only", prompt=0, max_output=100_000)
        admission = await meter.admit(big)
        assert admission.reserved_nano_usd == 100_000 * 15000 // 2
        now = datetime.now(UTC)
        await meter.settle(
            admission,
            UsageReport(
                big.request_id, org, big.key_id, big.model, big.tier, 0, 0, 80_000, now, now,
                "complete",
            ),
        )  # fmt: skip
        period = str(admission.reservation_id).split("/")[0]
        budget = meter.keys.budget_prefix(org) + period
        assert int(await meter.redis.hget(budget, "used")) == 80_000 * 15000 // 2  # $0.60
        # $0.40 left. $1.00 of list at worst would count $0.40 of allowance and $0.20 of
        # overage at list, which this plan refuses; $0.80 of list fits the allowance.
        with pytest.raises(AdmissionRefused):
            await meter.admit(
                admission_request(
                    org=org, plan="allowance-only", prompt=0, max_output=1_000_000_000 // 15000
                )
            )
        fits = admission_request(
            org=org, plan="allowance-only", prompt=0, max_output=800_000_000 // 15000 - 1
        )
        assert (await meter.admit(fits)).reserved_nano_usd == (800_000_000 // 15000 - 1) * 7500
    finally:
        await meter.aclose()
