"""The ledger on SQLite and PostgreSQL: migrations, deduplicated append-only usage rows,
adjustments, the stream consumer with its dead letters, usage summary and invoice lines."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
import redis
from sqlalchemy import Engine, func, inspect, select, text
from sqlalchemy.exc import DBAPIError
from typer.testing import CliRunner

from billing.cli import billing_app
from billing.ledger import UsageRow, make_engine, migrate
from billing.ledger.consumer import UsageStreamConsumer
from billing.ledger.invoice import invoice_preview
from billing.ledger.reporting import UsageUnavailable
from billing.ledger.summary import usage_summary
from billing.ledger.usage_reader import LedgerUsageReader
from billing.ledger.writes import add_adjustment, insert_usage_events
from billing.prices.pricing import load_pricebook
from billing.settings import DEFAULT_PRICEBOOK_PATH, BillingSettings
from tests.support.builders import LEDGER_DAY_ONE as DAY_ONE
from tests.support.builders import ledger_event

DAY_TWO = datetime(2026, 11, 4, 23, 59, 59, tzinfo=UTC)


def test_usage_rows_are_deduplicated_and_append_only(ledger: Engine) -> None:
    with ledger.begin() as connection:
        assert insert_usage_events(connection, [ledger_event("e1"), ledger_event("e2")]) == 2
    with ledger.begin() as connection:
        assert insert_usage_events(connection, [ledger_event("e2"), ledger_event("e3")]) == 1
    with ledger.connect() as connection:
        assert connection.execute(select(func.count()).select_from(UsageRow)).scalar_one() == 3
    for statement in ("UPDATE usage_events SET prompt_tokens = 0", "DELETE FROM usage_events"):
        with pytest.raises(DBAPIError, match="append-only"), ledger.begin() as connection:
            connection.execute(text(statement))


def test_rows_of_a_release_before_the_promotion_rule_migrate(ledger_url: str) -> None:
    engine = make_engine(ledger_url)
    migrate(engine, "0003")
    now = datetime.now(UTC).replace(tzinfo=None)
    with engine.begin() as connection:
        connection.execute(
            text(
                "INSERT INTO usage_events (event_id, org_id, key_id, plan, model, tier, "
                "prompt_tokens, cached_tokens, completion_tokens, list_cost_nano_usd, "
                "allowance_consumed_nano_usd, promotion_multiplier, price_version, started_at, "
                "ended_at, outcome, recorded_at) VALUES ('old-1', 'org-old', 'k', 'pro', "
                "'composer-2.5', 'fast', 10, 0, 5, 210000, 105000, '2', 'v', :now, :now, "
                "'complete', :now)"
            ),
            {"now": now},
        )
        connection.execute(
            text(
                "INSERT INTO usage_adjustments (adjustment_id, org_id, tier, effective_at, "
                "list_cost_delta_nano_usd, allowance_delta_nano_usd, reason, created_at) "
                "VALUES ('adj-old', 'org-old', 'fast', :now, -7, -7, 'credit', :now)"
            ),
            {"now": now},
        )
    migrate(engine)
    with engine.connect() as connection:
        row = connection.execute(select(UsageRow)).one()
        delta = connection.execute(text("SELECT list_cost_delta_nano_usd FROM usage_adjustments"))
        assert delta.scalar_one() == -7
    assert (row.list_cost_nano_usd, row.allowance_cost_nano_usd) == (210_000, 105_000)
    with pytest.raises(DBAPIError, match="append-only"), engine.begin() as connection:
        connection.execute(text("UPDATE usage_events SET prompt_tokens = 0"))


def test_summary_by_day_and_tier_with_adjustments(
    ledger: Engine, billing_settings: BillingSettings
) -> None:
    """Plan pico includes $0.003 (3,000,000 nano-USD); written out of start order."""
    book = load_pricebook(billing_settings.pricebook_path)
    launch = {"promotion_multiplier": "2", "promotion_id": "launch-week"}
    with ledger.begin() as connection:
        insert_usage_events(
            connection,
            [
                ledger_event("c", at=DAY_TWO, plan="pico"),  # 4,500,000 of list: overage
                # 750,000 of list and of allowance: 2,250,000 left after it.
                ledger_event("a", at=DAY_ONE, tier="standard", plan="pico"),
                # 9,000,000 of list at half: 2,250,000 of allowance covers 4,500,000.
                ledger_event(
                    "b",
                    at=DAY_ONE.replace(hour=12),
                    plan="pico",
                    completion_tokens=400,
                    list_cost_nano_usd=9_000_000,
                    allowance_cost_nano_usd=4_500_000,
                    **launch,
                ),
                ledger_event("other-org", at=DAY_ONE, org_id="org-other"),
            ],
        )
        assert add_adjustment(
            connection,
            adjustment_id="adj-1",
            org_id="org-ledger",
            tier="fast",
            list_cost_delta_nano_usd=-1_000_000,
            reason="goodwill credit",
            effective_at=DAY_TWO,
        )
        assert not add_adjustment(
            connection,
            adjustment_id="adj-1",
            org_id="org-ledger",
            tier="fast",
            list_cost_delta_nano_usd=-1_000_000,
            reason="the same credit again",
        )
    summary = usage_summary(ledger, book, "org-ledger", DAY_ONE.date(), DAY_TWO.date())
    rows = {(d["date"], d["tier"]): d for d in summary["data"]}
    assert set(rows) == {("2026-11-03", "fast"), ("2026-11-03", "standard"), ("2026-11-04", "fast")}
    standard = rows[("2026-11-03", "standard")]
    assert (standard["list_cost_nano_usd"], standard["allowance_used_nano_usd"]) == (750_000,) * 2
    promoted = rows[("2026-11-03", "fast")]
    assert promoted["list_cost"] == "$0.009000000"
    assert promoted["allowance_used_nano_usd"] == 2_250_000
    assert promoted["promotion_savings_nano_usd"] == 2_250_000
    assert promoted["overage_nano_usd"] == 4_500_000
    day_two = rows[("2026-11-04", "fast")]
    assert day_two["list_cost_nano_usd"] == 4_500_000
    assert (day_two["allowance_used_nano_usd"], day_two["overage_nano_usd"]) == (0, 4_500_000)
    assert day_two["adjustments_nano_usd"] == -1_000_000
    totals = summary["totals"]
    assert totals["requests"] == 3
    assert totals["prompt_tokens"] == 3000
    assert totals["list_cost_nano_usd"] == 750_000 + 9_000_000 + 4_500_000
    assert totals["allowance_used"] == "$0.003000000"
    assert totals["promotion_savings"] == "$0.002250000"
    assert totals["overage"] == "$0.009000000"


async def test_usage_reader_reads_but_never_migrates(ledger_url: str) -> None:
    reader = LedgerUsageReader(ledger_url, DEFAULT_PRICEBOOK_PATH)
    try:
        with pytest.raises(UsageUnavailable, match="cstack billing migrate"):
            await reader.usage_summary("org-ledger")
        engine = make_engine(ledger_url)
        assert not inspect(engine).has_table(UsageRow.__tablename__)
        migrate(engine)
        with engine.begin() as connection:
            insert_usage_events(connection, [ledger_event("e-read")])
        engine.dispose()
        summary = await reader.usage_summary("org-ledger", DAY_ONE.date(), DAY_ONE.date())
        assert summary["totals"]["requests"] == 1
    finally:
        await reader.aclose()


def test_invoice_preview_rounds_each_line_once(
    ledger: Engine, billing_settings: BillingSettings
) -> None:
    book = load_pricebook(billing_settings.pricebook_path)
    # 333 output tokens of standard = 832,500 nano-USD per request: $0.0008325 each.
    with ledger.begin() as connection:
        insert_usage_events(
            connection,
            [
                ledger_event(
                    f"inv-{i}",
                    tier="standard",
                    prompt_tokens=0,
                    completion_tokens=333,
                    list_cost_nano_usd=832_500,
                    allowance_cost_nano_usd=832_500,
                )
                for i in range(10)
            ],
        )
    preview = invoice_preview(ledger, book, "org-ledger", "2026-11")  # within pro's $100
    (usage_line, allowance_line) = preview.lines
    assert usage_line.quantity == 3330
    assert usage_line.amount_nano_usd == 8_325_000
    assert usage_line.amount_cents == 1  # $0.008325 rounds once, to $0.01
    assert allowance_line.amount_cents == -1
    assert preview.total_cents == 0
    assert "standard output tokens @ $2.50/1M" in preview.render()


def test_invoice_preview_command(
    ledger_url: str, ledger: Engine, billing_settings: BillingSettings
) -> None:
    with ledger.begin() as connection:
        insert_usage_events(
            connection, [ledger_event(f"cli-{i}", completion_tokens=100_000) for i in range(3)]
        )
    env = {
        "CSTACK_LEDGER_URL": ledger_url,
        "CSTACK_PRICEBOOK_PATH": str(billing_settings.pricebook_path),
    }
    runner = CliRunner()
    ok = runner.invoke(
        billing_app, ["invoice-preview", "--org", "org-ledger", "--period", "2026-11"], env=env
    )
    assert ok.exit_code == 0, ok.output
    assert "composer-2.5 fast input tokens @ $3.00/1M" in ok.stdout
    assert "composer-2.5 fast output tokens @ $15.00/1M" in ok.stdout
    assert "$4.50" in ok.stdout  # 300,000 output tokens x $15/1M
    bad = runner.invoke(
        billing_app, ["invoice-preview", "--org", "org-ledger", "--period", "November"], env=env
    )
    assert bad.exit_code == 1
    assert bad.stderr.strip() == "error: period must look like 2026-11, got 'November'"


def test_consumer_writes_once_and_dead_letters_poison(
    ledger: Engine, billing_settings: BillingSettings
) -> None:
    client = redis.Redis.from_url(billing_settings.redis_url)
    stream = billing_settings.usage_stream
    for i in range(5):
        client.xadd(stream, {"event": ledger_event(f"s-{i}").model_dump_json()})
    client.xadd(stream, {"event": ledger_event("s-0").model_dump_json()})  # a replayed duplicate
    client.xadd(stream, {"event": b"{not json"})
    client.xadd(stream, {"something": b"else"})
    consumer = UsageStreamConsumer(client, ledger, billing_settings)
    result = consumer.drain(max_seconds=10)
    assert (result.read, result.inserted, result.dead_lettered) == (8, 5, 2)
    assert client.xlen(stream) == 0
    dead = client.xrange(billing_settings.usage_dead_letter_stream)
    assert [fields[b"reason"].decode().split(":")[0] for _, fields in dead] == [
        "not a usage event"
    ] * 2
    with ledger.connect() as connection:
        assert connection.execute(select(func.count()).select_from(UsageRow)).scalar_one() == 5


def test_this_releases_migrations_go_down_and_up_again(ledger_url: str) -> None:
    """0004 to 0007 undone and redone, with rows in every table they touch."""
    from alembic import command

    from billing.ledger.database import alembic_config

    engine = make_engine(ledger_url)
    migrate(engine)
    with engine.begin() as connection:
        insert_usage_events(connection, [ledger_event("down-up")])
    config = alembic_config()
    with engine.begin() as connection:
        config.attributes["connection"] = connection
        command.downgrade(config, "0003")
    with engine.connect() as connection:
        old = connection.execute(text("SELECT allowance_consumed_nano_usd FROM usage_events"))
        assert old.scalar_one() == 1000 * 3000 + 100 * 15000
    migrate(engine)
    with engine.connect() as connection:
        assert connection.execute(select(UsageRow.allowance_cost_nano_usd)).scalar_one() == (
            1000 * 3000 + 100 * 15000
        )
