"""Ledger -> Stripe meter events against a local Stripe stand-in (a real HTTP server
process driven by stripe-python): aggregation per customer, meter and minute, retries
with back-off, a crash between Stripe's answer and our commit, and late usage."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from pydantic import SecretStr
from sqlalchemy import Engine, select, update
from test_ledger import event

from billing.events import UsageEvent
from billing.ledger import StripeMeterEvent, insert_usage_events, make_engine, migrate
from billing.pricing import load_pricebook
from billing.settings import BillingSettings
from billing.stripe_sync import sync_stripe

NOW = datetime(2026, 11, 30, 12, 0, 30, tzinfo=UTC)
MINUTE_A = datetime(2026, 11, 30, 11, 58, 10, tzinfo=UTC)
MINUTE_B = datetime(2026, 11, 30, 11, 59, 50, tzinfo=UTC)


def usage(
    event_id: str, at: datetime, customer: str, prompt: int, completion: int, tier: str = "fast"
) -> UsageEvent:
    return event(
        event_id,
        at=at,
        tier=tier,
        customer_id=customer,
        prompt_tokens=prompt,
        completion_tokens=completion,
    )


def ledger_with_usage(settings: BillingSettings) -> Engine:
    engine = make_engine(settings.ledger_url)
    migrate(engine)
    with engine.begin() as connection:
        insert_usage_events(
            connection,
            [
                event(
                    "a1", at=MINUTE_A, customer_id="cus_A", prompt_tokens=100, completion_tokens=10
                ),
                event(
                    "a2", at=MINUTE_A, customer_id="cus_A", prompt_tokens=200, completion_tokens=20
                ),
                event(
                    "a3",
                    at=MINUTE_A,
                    customer_id="cus_A",
                    tier="standard",
                    prompt_tokens=7,
                    completion_tokens=0,
                ),
                event("a4", at=MINUTE_B, customer_id="cus_A", prompt_tokens=1, completion_tokens=2),
                event("b1", at=MINUTE_A, customer_id="cus_B", prompt_tokens=5, completion_tokens=6),
                event("none", at=MINUTE_A, customer_id=None),
                # Still in the open minute: reported by a later run.
                event("open", at=NOW, customer_id="cus_A"),
            ],
        )
    return engine


def meter(
    customer: str, tier: str, minute_batch: str, direction: str, value: int
) -> tuple[str, tuple[str, str, str]]:
    """The identifier and (customer, meter, value) of one expected meter event."""
    identifier = f"cstack.{customer}.{tier}.20261130T{minute_batch}.{direction}"
    return identifier, (customer, f"composer_{tier}_{direction}_tokens", str(value))


def accepted_by_identifier(server) -> dict[str, tuple[str, str, str]]:  # type: ignore[no-untyped-def]
    accepted = server.accepted()
    identifiers = [r["identifier"] for r in accepted]
    assert len(identifiers) == len(set(identifiers)), "a meter event was accepted twice"
    for record in accepted:
        assert record["idempotency_key"] == record["identifier"]
    return {r["identifier"]: (r["customer"], r["event_name"], r["value"]) for r in accepted}


def test_meter_events_are_sent_once_across_retries_and_a_lost_commit(
    billing_settings: BillingSettings, stripe_server: Callable[..., object], ledger_url: str
) -> None:
    server = stripe_server(fail_first=2)
    settings = billing_settings.model_copy(
        update={
            "ledger_url": ledger_url,
            "stripe_api_base": server.base_url,  # type: ignore[attr-defined]
            "stripe_api_key": SecretStr("sk_test_billing"),
            "stripe_retry_base_s": 60,
        }
    )
    book = load_pricebook(settings.pricebook_path)
    engine = ledger_with_usage(settings)

    sent, failed = sync_stripe(engine, book, settings, NOW)
    assert (sent, failed) == (5, 2)  # 7 meter events; the stand-in failed the first two
    with engine.connect() as connection:
        waiting = connection.execute(
            select(StripeMeterEvent).where(StripeMeterEvent.status == "pending")
        ).all()
    assert [(w.attempts, w.next_attempt_at) for w in waiting] == [
        (1, NOW + timedelta(seconds=60))
    ] * 2
    assert sync_stripe(engine, book, settings, NOW + timedelta(seconds=30)) == (0, 0)  # backing off
    # The two retried, and the 12:00 minute (closed by now) as two new ones.
    assert sync_stripe(engine, book, settings, NOW + timedelta(seconds=61)) == (4, 0)

    # A worker that crashed after Stripe answered but before its commit resends: the
    # identifier doubles as idempotency key, so Stripe replays instead of counting twice.
    with engine.begin() as connection:
        connection.execute(update(StripeMeterEvent).values(status="pending"))
    assert sync_stripe(engine, book, settings, NOW + timedelta(seconds=62)) == (9, 0)

    expected = dict(
        [
            meter("cus_A", "fast", "1158.0", "input", 300),
            meter("cus_A", "fast", "1158.0", "output", 30),
            meter("cus_A", "standard", "1158.0", "input", 7),
            meter("cus_A", "fast", "1159.0", "input", 1),
            meter("cus_A", "fast", "1159.0", "output", 2),
            meter("cus_B", "fast", "1158.0", "input", 5),
            meter("cus_B", "fast", "1158.0", "output", 6),
            meter("cus_A", "fast", "1200.0", "input", 1000),
            meter("cus_A", "fast", "1200.0", "output", 100),
        ]
    )
    assert accepted_by_identifier(server) == expected
    replayed = [r for r in server.requests() if r["result"] == "replayed"]  # type: ignore[attr-defined]
    assert len(replayed) == 9

    # Usage that shows up late for an already reported minute gets its own batch.
    with engine.begin() as connection:
        insert_usage_events(
            connection,
            [event("late", at=MINUTE_A, customer_id="cus_B", prompt_tokens=9, completion_tokens=0)],
        )
    later = NOW + timedelta(minutes=5)
    assert sync_stripe(engine, book, settings, later) == (1, 0)
    accepted = accepted_by_identifier(server)
    assert accepted["cstack.cus_B.fast.20261130T1158.1.input"] == (
        "cus_B",
        "composer_fast_input_tokens",
        "9",
    )
    assert sync_stripe(engine, book, settings, later + timedelta(minutes=5)) == (0, 0)
