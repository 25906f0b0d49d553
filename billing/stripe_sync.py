"""Reporting ledger usage to Stripe as meter events, each sent once.

Two steps, each its own transaction. ``plan_meter_events`` groups unreported usage per
(customer, tier, minute) into a numbered batch, records the batch's meter events (one per
non-zero direction) and marks the rows as reported, all in one commit. ``send_meter_events``
then sends each pending event with its deterministic identifier as the idempotency key, so
a crash between Stripe's answer and our commit only resends something Stripe already
deduplicates. Failures back off exponentially per event.
"""

from __future__ import annotations

import hashlib
import logging
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from typing import Any

import stripe
from sqlalchemy import Connection, Engine, func, insert, select, update

from billing import metrics
from billing.ledger import StripeMeterEvent, StripeReportedUsage, UsageRow
from billing.pricebook import Direction, PriceBook
from billing.settings import BillingSettings

logger = logging.getLogger(__name__)

MAX_IDENTIFIER = 100
PLAN_ROWS_PER_RUN = 50_000
SEND_PER_RUN = 1_000


def floor_minute(at: datetime) -> datetime:
    return at.astimezone(UTC).replace(second=0, microsecond=0)


def batch_name(customer_id: str, tier: str, minute: datetime, sequence: int) -> str:
    return f"{customer_id}.{tier}.{minute:%Y%m%dT%H%M}.{sequence}"


def meter_event_identifier(batch: str, direction: Direction) -> str:
    """Deterministic, unique per batch and direction, within Stripe's 100 characters."""
    identifier = f"cstack.{batch}.{direction}"
    if len(identifier) <= MAX_IDENTIFIER:
        return identifier
    return "cstack." + hashlib.sha256(identifier.encode()).hexdigest()


def plan_meter_events(connection: Connection, book: PriceBook, now: datetime, grace_s: int) -> int:
    """Turn closed minutes of unreported usage into pending meter events; returns how many."""
    cutoff = floor_minute(now - timedelta(seconds=grace_s))
    rows = connection.execute(
        select(
            UsageRow.event_id,
            UsageRow.customer_id,
            UsageRow.tier,
            UsageRow.prompt_tokens,
            UsageRow.completion_tokens,
            UsageRow.ended_at,
        )
        .outerjoin(StripeReportedUsage, StripeReportedUsage.event_id == UsageRow.event_id)
        .where(StripeReportedUsage.event_id.is_(None))
        .where(UsageRow.customer_id.is_not(None))
        .where(UsageRow.ended_at < cutoff)
        .order_by(UsageRow.id)
        .limit(PLAN_ROWS_PER_RUN)
    ).all()
    groups: dict[tuple[str, str, datetime], list[Any]] = defaultdict(list)
    for row in rows:
        groups[(row.customer_id, row.tier, floor_minute(row.ended_at))].append(row)
    planned = 0
    for (customer_id, tier, minute), members in groups.items():
        # Usage that arrives late for an already-reported minute gets the next batch
        # number, so its identifier differs from the batch Stripe already has.
        prefix = batch_name(customer_id, tier, minute, 0)[:-1]
        earlier = connection.execute(
            select(func.count(func.distinct(StripeReportedUsage.batch))).where(
                StripeReportedUsage.batch.startswith(prefix, autoescape=True)
            )
        ).scalar_one()
        batch = batch_name(customer_id, tier, minute, int(earlier))
        totals: dict[Direction, int] = {
            "input": sum(r.prompt_tokens for r in members),
            "output": sum(r.completion_tokens for r in members),
        }
        for direction, value in totals.items():
            if value <= 0:
                continue
            connection.execute(
                insert(StripeMeterEvent).values(
                    identifier=meter_event_identifier(batch, direction),
                    customer_id=customer_id,
                    event_name=book.stripe_meters[tier][direction],  # type: ignore[index]
                    minute=minute,
                    value=value,
                    status="pending",
                    attempts=0,
                    next_attempt_at=now,
                    created_at=now,
                )
            )
            planned += 1
        connection.execute(
            insert(StripeReportedUsage),
            [{"event_id": r.event_id, "batch": batch} for r in members],
        )
    return planned


def stripe_client(settings: BillingSettings) -> stripe.StripeClient:
    if settings.stripe_api_key is None:
        raise RuntimeError("CSTACK_STRIPE_API_KEY is not set; cannot report usage to Stripe")
    base = settings.stripe_api_base.rstrip("/")
    return stripe.StripeClient(
        settings.stripe_api_key.get_secret_value(),
        base_addresses={"api": base, "meter_events": base},
        # Retries are ours (persisted, backed off); stripe-python's would hide failures.
        max_network_retries=0,
    )


def backoff(attempts: int, settings: BillingSettings) -> timedelta:
    seconds = min(settings.stripe_retry_max_s, settings.stripe_retry_base_s * 2 ** (attempts - 1))
    return timedelta(seconds=seconds)


def send_meter_events(
    engine: Engine, client: stripe.StripeClient, settings: BillingSettings, now: datetime
) -> tuple[int, int]:
    """Send due pending meter events; returns (sent, failed)."""
    with engine.connect() as connection:
        due = connection.execute(
            select(StripeMeterEvent)
            .where(StripeMeterEvent.status == "pending")
            .where(StripeMeterEvent.next_attempt_at <= now)
            .order_by(StripeMeterEvent.id)
            .limit(SEND_PER_RUN)
        ).all()
    sent = failed = 0
    for event in due:
        try:
            client.v1.billing.meter_events.create(
                params={
                    "event_name": event.event_name,
                    "identifier": event.identifier,
                    "timestamp": int(event.minute.timestamp()),
                    "payload": {
                        "stripe_customer_id": event.customer_id,
                        "value": str(event.value),
                    },
                },
                options={"idempotency_key": event.identifier},
            )
        except stripe.StripeError as exc:
            failed += 1
            attempts = event.attempts + 1
            logger.warning(
                "Stripe meter event %s failed (attempt %d): %s", event.identifier, attempts, exc
            )
            with engine.begin() as connection:
                connection.execute(
                    update(StripeMeterEvent)
                    .where(StripeMeterEvent.id == event.id)
                    .values(
                        attempts=attempts,
                        next_attempt_at=now + backoff(attempts, settings),
                        last_error=str(exc)[:2000],
                    )
                )
            metrics.stripe_meter_events.labels("failed").inc()
            continue
        with engine.begin() as connection:
            connection.execute(
                update(StripeMeterEvent)
                .where(StripeMeterEvent.id == event.id)
                .values(status="sent", sent_at=now, attempts=event.attempts + 1)
            )
        sent += 1
        metrics.stripe_meter_events.labels("sent").inc()
    return sent, failed


def sync_stripe(
    engine: Engine, book: PriceBook, settings: BillingSettings, now: datetime | None = None
) -> tuple[int, int]:
    """One sync run: plan new meter events, then send what is due."""
    current = now or datetime.now(UTC)
    with engine.begin() as connection:
        plan_meter_events(connection, book, current, settings.stripe_minute_grace_s)
    sent, failed = send_meter_events(engine, stripe_client(settings), settings, current)
    if failed:
        metrics.stripe_sync_failures.inc()
    else:
        metrics.stripe_last_success.set(current.timestamp())
    return sent, failed
