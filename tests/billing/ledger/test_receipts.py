"""Receipts from the ledger (SQLite and PostgreSQL): a page at a time in allowance order,
filtered, found by any of a request's ids, as CSV, and adding up exactly to the invoice.

The org's plan includes $0.001 (1,000,000 nano-USD); the promotion counts usage half
from 11-10 to 11-13. Every amount is worked out by hand in the comments.
"""

from __future__ import annotations

import csv
import io
import uuid
from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlalchemy import Engine

from billing.ledger import make_engine, migrate
from billing.ledger.invoice import invoice_preview
from billing.ledger.receipts import CSV_COLUMNS, csv_cell, find_receipt, list_receipts, month_csv
from billing.ledger.reporting import BadReceiptQuery, ReceiptNotUnique, ReceiptQuery
from billing.ledger.writes import insert_usage_events
from billing.prices.pricebook import PriceBook
from billing.prices.pricing import load_pricebook
from tests.support.billing import write_test_book
from tests.support.builders import hand_event

VERSIONS = [
    {
        "version": "2026-11-01",
        "effective_from": "2026-11-01T00:00:00Z",
        "tiers": {
            "standard": {"input_per_1m": "0.50", "output_per_1m": "2.50"},
            "fast": {"input_per_1m": "3.00", "output_per_1m": "15.00"},
        },
    }
]
PLANS = {
    "hand": {
        "included_usd": "0.001",
        "overage": "billed",
        "overage_budget_usd": "1.00",
        "rpm": 1000,
        "tpm": 10**8,
    }
}
PROMOTIONS = [
    {
        "id": "launch-week",
        "starts_at": "2026-11-10T00:00:00Z",
        "days": 3,
        "models": ["composer-2.5*"],
        "usage_multiplier": "2",
    }
]
#: Months ending by then are final (their grace has passed).
AFTER_NOVEMBER = datetime(2026, 12, 1, 1, 0, 1, tzinfo=UTC)


def nov(day: int, hour: int = 12) -> datetime:
    return datetime(2026, 11, day, hour, 0, tzinfo=UTC)


@pytest.fixture
def book(tmp_path: Path) -> PriceBook:
    path = tmp_path / "receipts.yaml"
    return load_pricebook(
        write_test_book(path, versions=VERSIONS, plans=PLANS, promotions=PROMOTIONS)
    )


@pytest.fixture
def month(ledger_url: str) -> tuple[Engine, str, str]:
    """An org's November (and one request of another org); (ledger, org, other org)."""
    engine = make_engine(ledger_url)
    migrate(engine)
    org, other = f"org-r-{uuid.uuid4().hex[:6]}", f"org-o-{uuid.uuid4().hex[:6]}"
    events = [
        # 100 x 3000 + 20 x 15000 = 600,000: inside the allowance, 400,000 left.
        hand_event(org, "r1", nov(5), tier="fast", version="2026-11-01", prompt=100,
                   completion=20, list_cost=600_000, key="key-1", model="composer-2.5-fast"),
        # 1000 x 500 + 200 x 2500 = 1,000,000 at half: 500,000 of allowance, 400,000 left
        # covers 800,000; 200,000 is overage.
        hand_event(org, "r2", nov(10), tier="standard", version="2026-11-01", prompt=1000,
                   completion=200, list_cost=1_000_000, multiplier="2", key="key-2"),
        # 10 x 3000 + 10 x 15000 = 180,000: overage.
        hand_event(org, "r3", nov(11), tier="fast", version="2026-11-01", prompt=10,
                   completion=10, list_cost=180_000, multiplier="2", key="key-1",
                   client_request_id="mine"),
        # 2000 x 500 = 1,000,000: overage.
        hand_event(org, "r4", nov(20), tier="standard", version="2026-11-01", prompt=2000,
                   completion=0, list_cost=1_000_000, key="key-2", client_request_id="once"),
        # 3000 + 15000 = 18,000: overage.
        hand_event(org, "r5", nov(20, 13), tier="fast", version="2026-11-01", prompt=1,
                   completion=1, list_cost=18_000, key="key-1", client_request_id="mine"),
        hand_event(other, "x1", nov(6), tier="fast", version="2026-11-01", prompt=1,
                   completion=1, list_cost=18_000),
    ]  # fmt: skip
    with engine.begin() as connection:
        insert_usage_events(connection, events[::-1])  # the order written does not matter
    return engine, org, other


def page(engine: Engine, book: PriceBook, org: str, **query: object) -> dict[str, object]:
    with engine.connect() as connection:
        return list_receipts(connection, book, org, ReceiptQuery(**query), AFTER_NOVEMBER)  # type: ignore[arg-type]


def test_receipts_page_in_allowance_order_and_add_up_to_the_invoice(
    month: tuple[Engine, str, str], book: PriceBook
) -> None:
    engine, org, _ = month
    receipts: list[dict[str, object]] = []
    after = None
    while True:
        listed = page(engine, book, org, limit=2, after=after)
        receipts += listed["data"]  # type: ignore[arg-type]
        if not listed["has_more"]:
            break
        after = listed["last_id"]
    assert [r["id"] for r in receipts] == [f"{org}-r{i}" for i in range(1, 6)]
    r2 = receipts[1]
    assert {k: r2[k] for k in r2 if k not in ("started_at", "ended_at", "id", "period")} == {
        "object": "usage.request",
        "x_request_id": None,
        "outcome": "complete",
        "key_id": "key-2",
        "model": "composer-2.5",
        "tier": "standard",
        "input_tokens": 1000,
        "cached_input_tokens": 0,
        "output_tokens": 200,
        "reasoning_tokens": None,
        "price_version": "2026-11-01",
        "unit_prices_nano_usd": {"input": 500, "cached_input": 500, "output": 2500},
        "list_cost_nano_usd": 1_000_000,
        "promotion": {"id": "launch-week", "usage_multiplier": "2"},
        "allowance_cost_nano_usd": 500_000,
        "allowance_consumed_nano_usd": 400_000,
        "promotion_credit_nano_usd": 400_000,
        "overage_nano_usd": 200_000,
        "final": True,
    }

    # Exactly the invoice, line by line in nano-USD.
    lines = {line.key: line for line in invoice_preview(engine, book, org, "2026-11").lines}
    usage_lines = [line for key, line in lines.items() if key.count(".") == 2]
    assert sum(r["list_cost_nano_usd"] for r in receipts) == sum(  # type: ignore[misc]
        line.amount_nano_usd for line in usage_lines
    )
    assert sum(r["allowance_consumed_nano_usd"] for r in receipts) == 1_000_000  # type: ignore[misc]
    assert lines["allowance"].amount_nano_usd == -1_000_000
    assert sum(r["promotion_credit_nano_usd"] for r in receipts) == 400_000  # type: ignore[misc]
    assert lines["promotion"].amount_nano_usd == -400_000
    overage = 200_000 + 180_000 + 1_000_000 + 18_000
    assert sum(r["overage_nano_usd"] for r in receipts) == overage  # type: ignore[misc]
    assert sum(line.amount_nano_usd for line in lines.values()) == overage


def test_receipts_filters_and_lookups_are_the_orgs_own(
    month: tuple[Engine, str, str], book: PriceBook
) -> None:
    engine, org, other = month

    def ids(**query: object) -> list[str]:
        listed = page(engine, book, org, **query)
        return [str(r["id"]).rsplit("-", 1)[1] for r in listed["data"]]  # type: ignore[attr-defined]

    assert ids(tier="standard") == ["r2", "r4"]
    assert ids(key_id="key-1") == ["r1", "r3", "r5"]
    assert ids(model="composer-2.5-fast") == ["r1"]
    assert ids(start=nov(10), end=nov(20)) == ["r2", "r3"]
    assert ids(key_id="key-1", start=nov(11)) == ["r3", "r5"]
    with pytest.raises(BadReceiptQuery) as refused:
        page(engine, book, org, after=f"{other}-x1")  # another org's receipt is no cursor
    assert refused.value.param == "after"

    def find(wanted: str, *, of: str = org) -> str | None:
        with engine.connect() as connection:
            found = find_receipt(connection, book, of, wanted, AFTER_NOVEMBER)
        return None if found is None else str(found["id"]).rsplit("-", 1)[1]

    assert find(f"{org}-r4") == "r4"
    assert find(f"chatcmpl-{org}-r4") == "r4"
    assert find(f"cmpl-{org}-r1") == "r1"
    assert find("once") == "r4"  # the client's own x-request-id
    with pytest.raises(ReceiptNotUnique):
        find("mine")  # two requests carry it
    assert find(f"{other}-x1") is None  # another org's: as if it did not exist
    assert find(f"{other}-x1", of=other) == "x1"
    with engine.connect() as connection:
        open_month = find_receipt(connection, book, org, f"{org}-r1", nov(30))
    assert open_month is not None and open_month["final"] is False


def test_a_months_receipts_as_csv(month: tuple[Engine, str, str], book: PriceBook) -> None:
    engine, org, _ = month
    text = "".join(month_csv(engine, book, org, "2026-11", AFTER_NOVEMBER))
    rows = list(csv.DictReader(io.StringIO(text)))
    assert tuple(rows[0]) == CSV_COLUMNS
    assert [row["id"].rsplit("-", 1)[1] for row in rows] == ["r1", "r2", "r3", "r4", "r5"]
    assert sum(int(row["overage_nano_usd"]) for row in rows) == 1_398_000
    assert (rows[1]["promotion_id"], rows[1]["usage_multiplier"]) == ("launch-week", "2")
    assert (rows[0]["promotion_id"], rows[0]["usage_multiplier"]) == ("", "1")
    assert rows[2]["x_request_id"] == "mine" and rows[0]["reasoning_tokens"] == ""
    assert "".join(month_csv(engine, book, org, "2026-10", AFTER_NOVEMBER)).count("\n") == 1


def test_a_clients_request_id_never_reads_as_a_spreadsheet_formula() -> None:
    assert csv_cell("=HYPERLINK(1)") == "'=HYPERLINK(1)"
    assert csv_cell("@SUM(A1)") == "'@SUM(A1)"
    assert (csv_cell("client-1"), csv_cell(-200_000), csv_cell(None)) == ("client-1", -200_000, "")
