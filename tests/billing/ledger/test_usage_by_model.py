"""``GET /v1/usage?group_by=model`` and the keys' activity, from the ledger: the split by
model adds up to the split by tier, and an adjustment counts under the model of the
request it corrects."""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import Engine

from billing.ledger.summary import key_activity, usage_summary
from billing.ledger.writes import add_adjustment, insert_usage_events
from billing.prices.pricing import load_pricebook
from billing.settings import BillingSettings
from tests.support.builders import LEDGER_DAY_ONE as DAY_ONE
from tests.support.builders import ledger_event

DAY_TWO = datetime(2026, 11, 4, 9, tzinfo=UTC)
LAST_MONTH = datetime(2026, 10, 30, 9, tzinfo=UTC)
NO_MODEL = None


def test_usage_by_model_adds_up_to_usage_by_tier(
    ledger: Engine, billing_settings: BillingSettings
) -> None:
    book = load_pricebook(billing_settings.pricebook_path)
    with ledger.begin() as connection:
        insert_usage_events(
            connection,
            [
                ledger_event("a", at=DAY_ONE),  # composer-2.5, key-1
                ledger_event("b", at=DAY_ONE, model="composer-2.5-fast", key_id="key-2"),
                ledger_event("c", at=DAY_ONE, model="composer-2.5-fast", key_id="key-2"),
                ledger_event("d", at=DAY_TWO, tier="standard", model="composer-2.5-standard"),
                ledger_event("e", at=LAST_MONTH, key_id="key-3"),
                ledger_event("f", at=DAY_ONE, org_id="org-other", model="other-org-model"),
            ],
        )
        # An adjustment naming another org's request shows nothing of that request.
        for adjustment_id, event_id in (("adj-b", "b"), ("adj-none", None), ("adj-f", "f")):
            add_adjustment(
                connection,
                adjustment_id=adjustment_id,
                org_id="org-ledger",
                tier="fast",
                event_id=event_id,
                list_cost_delta_nano_usd=-1_000,
                reason="credit",
                effective_at=DAY_ONE,
            )
    by_tier = usage_summary(ledger, book, "org-ledger", DAY_ONE.date(), DAY_TWO.date())
    by_model = usage_summary(
        ledger, book, "org-ledger", DAY_ONE.date(), DAY_TWO.date(), by_model=True
    )
    one_fast = 1000 * 3000 + 100 * 15000  # nano-USD, by hand
    one_standard = 1000 * 500 + 100 * 2500
    rows = {(r["date"], r["tier"], r["model"]): r for r in by_model["data"]}
    assert {key: (r["requests"], r["list_cost_nano_usd"]) for key, r in rows.items()} == {
        ("2026-11-03", "fast", "composer-2.5"): (1, one_fast),
        ("2026-11-03", "fast", "composer-2.5-fast"): (2, 2 * one_fast),
        ("2026-11-03", "fast", NO_MODEL): (0, 0),  # the adjustments naming no request of its
        ("2026-11-04", "standard", "composer-2.5-standard"): (1, one_standard),
    }
    assert rows[("2026-11-03", "fast", "composer-2.5-fast")]["adjustments_nano_usd"] == -1_000
    assert rows[("2026-11-03", "fast", NO_MODEL)]["adjustments_nano_usd"] == -2_000
    assert by_model["totals"] == by_tier["totals"]
    for tier_row in by_tier["data"]:
        parts = [
            r
            for r in by_model["data"]
            if (r["date"], r["tier"]) == (tier_row["date"], tier_row["tier"])
        ]
        for field in ("requests", "completion_tokens", "list_cost_nano_usd", "overage_nano_usd"):
            assert sum(part[field] for part in parts) == tier_row[field]
    assert all("model" not in row for row in by_tier["data"])

    keys = ["key-1", "key-2", "key-3", "key-never-used"]
    activity = key_activity(ledger, "org-ledger", "2026-11", keys)
    assert set(activity) == {"key-1", "key-2", "key-3"}
    assert activity["key-1"]["last_used_at"] == DAY_TWO.isoformat()
    assert (activity["key-1"]["requests"], activity["key-1"]["list_cost_nano_usd"]) == (
        2,
        one_fast + one_standard,
    )
    assert activity["key-2"]["requests"] == 2
    # Used last month only: its last use shows, with nothing this month.
    assert activity["key-3"] == {
        "last_used_at": LAST_MONTH.isoformat(),
        "requests": 0,
        "list_cost_nano_usd": 0,
        "list_cost": "$0.000000000",
    }
    assert key_activity(ledger, "org-other", "2026-11", ["key-2"]) == {}
