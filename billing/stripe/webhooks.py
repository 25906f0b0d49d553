"""Stripe webhook handling: verified, deduplicated, and turned into org suspensions.

Stripe does not deliver events in order, and retries late ones for days. An org's
suspension follows the events' creation times: an event created before the one that set
the current state (a retried ``invoice.payment_failed`` after ``invoice.paid``) is
recorded as handled and changes nothing.

Redis is updated before the ledger commit that records the event as handled: if Redis is
down the endpoint fails, Stripe redelivers, and the (idempotent) Redis update is retried.
Admission reads suspension from Redis; the ledger keeps the durable record.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import stripe
from sqlalchemy import Connection, Engine, select

from billing.ledger import (
    OrgCustomer,
    OrgSuspension,
    StripeWebhookEvent,
    UsageRow,
    make_engine,
    migrate,
)
from billing.ledger.writes import dialect_insert, insert_ignoring_duplicates
from billing.meter.keyspace import Keyspace
from billing.redis.client import SyncClient, async_client
from billing.settings import BillingSettings

SUSPENDING = "invoice.payment_failed"
LIFTING = "invoice.paid"


class WebhookSignatureInvalid(ValueError):
    """The payload is not signed by our Stripe endpoint secret."""


@dataclass(frozen=True)
class WebhookOutcome:
    event_id: str
    type: str
    duplicate: bool
    org_id: str | None = None


def verify(payload: bytes, signature: str | None, secret: str) -> dict[str, Any]:
    """Check ``Stripe-Signature`` with stripe-python's own verification."""
    try:
        event = stripe.Webhook.construct_event(payload.decode("utf-8"), signature, secret)
    except (stripe.SignatureVerificationError, ValueError, UnicodeDecodeError) as exc:
        raise WebhookSignatureInvalid(str(exc)) from None
    return dict(event.to_dict())


def _created_at(event: dict[str, Any]) -> datetime | None:
    """The event's ``created`` (Unix seconds), if it carries a usable one."""
    created = event.get("created")
    if isinstance(created, int) and not isinstance(created, bool) and 0 < created < 2**37:
        return datetime.fromtimestamp(created, UTC)
    return None


def _org_for(connection: Connection, invoice: dict[str, Any]) -> str | None:
    metadata = invoice.get("metadata") or {}
    if metadata.get("org_id"):
        return str(metadata["org_id"])
    customer = invoice.get("customer")
    if not customer:
        return None
    owner = connection.execute(
        select(OrgCustomer.org_id).where(OrgCustomer.customer_id == customer).limit(1)
    ).scalar_one_or_none()
    if owner is not None:
        return str(owner)
    # A customer an org no longer has: the org whose usage last named it.
    return connection.execute(
        select(UsageRow.org_id)
        .where(UsageRow.customer_id == customer)
        .order_by(UsageRow.id.desc())
        .limit(1)
    ).scalar_one_or_none()


class WebhookService:
    def __init__(self, settings: BillingSettings) -> None:
        self.settings = settings
        self.redis = async_client(settings.redis_url)
        self.keys = Keyspace(settings.billing_shards, settings.usage_stream)
        self.engine: Engine = make_engine(settings.ledger_url)
        self._migrated = False

    def _seen(self, event_id: str) -> bool:
        if not self._migrated:
            migrate(self.engine)
            self._migrated = True
        with self.engine.connect() as connection:
            found = connection.execute(
                select(StripeWebhookEvent.event_id).where(StripeWebhookEvent.event_id == event_id)
            ).first()
        return found is not None

    def _resolve_org(self, invoice: dict[str, Any]) -> str | None:
        with self.engine.connect() as connection:
            return _org_for(connection, invoice)

    def _superseded(self, org_id: str, created: datetime | None) -> bool:
        """An event created before the one that set ``org_id``'s state is too old to apply."""
        if created is None:
            return False
        with self.engine.connect() as connection:
            current = connection.execute(
                select(OrgSuspension.event_created_at).where(OrgSuspension.org_id == org_id)
            ).scalar_one_or_none()
        return current is not None and created < current

    def _record(
        self,
        event: dict[str, Any],
        org_id: str | None,
        suspended: bool | None,
        created: datetime | None,
    ) -> bool:
        now = datetime.now(UTC)
        with self.engine.begin() as connection:
            statement = insert_ignoring_duplicates(
                connection, StripeWebhookEvent.__table__, "event_id"
            ).values(event_id=event["id"], type=event["type"], received_at=now)
            if connection.execute(statement.returning(StripeWebhookEvent.event_id)).first() is None:
                return False
            if org_id is not None and suspended is not None:
                invoice = event["data"]["object"]
                values = {
                    "org_id": org_id,
                    "customer_id": invoice.get("customer"),
                    "suspended": suspended,
                    "reason": event["type"],
                    "updated_at": now,
                    "event_created_at": created,
                }
                newer = OrgSuspension.__table__.c.event_created_at
                connection.execute(
                    dialect_insert(connection, OrgSuspension.__table__)
                    .values(**values)
                    .on_conflict_do_update(
                        index_elements=["org_id"],
                        set_=values,
                        # Two deliveries racing: the ledger keeps the newer event's state.
                        where=None if created is None else (newer.is_(None) | (newer <= created)),
                    )
                )
        return True

    async def handle(self, event: dict[str, Any]) -> WebhookOutcome:
        event_id, event_type = str(event["id"]), str(event["type"])
        if await asyncio.to_thread(self._seen, event_id):
            return WebhookOutcome(event_id, event_type, duplicate=True)
        suspended: bool | None = None
        org_id: str | None = None
        created = _created_at(event)
        if event_type in (SUSPENDING, LIFTING):
            invoice = event["data"]["object"]
            org_id = await asyncio.to_thread(self._resolve_org, invoice)
            if org_id is not None and await asyncio.to_thread(self._superseded, org_id, created):
                new = await asyncio.to_thread(self._record, event, org_id, None, created)
                return WebhookOutcome(event_id, event_type, duplicate=not new, org_id=org_id)
            suspended = event_type == SUSPENDING
            keys = [self.keys.suspended_org(org_id)] if org_id else []
            if invoice.get("customer"):
                keys += self.keys.suspended_customer_everywhere(str(invoice["customer"]))
            # Not one transaction: on a cluster the flags are on several shards. Each
            # write is idempotent, and a failure part way fails the endpoint, so Stripe
            # delivers the event again.
            for key in keys:  # one by one: a webhook is rare, and a few flags
                if suspended:
                    await self.redis.set(key, event_id)
                else:
                    await self.redis.delete(key)
        new = await asyncio.to_thread(self._record, event, org_id, suspended, created)
        return WebhookOutcome(event_id, event_type, duplicate=not new, org_id=org_id)


def restore_suspensions(engine: Engine, redis: SyncClient, keys: Keyspace) -> int:
    """Re-assert every suspended org in Redis from the ledger's durable record.

    Admission reads suspension from Redis only; after a Redis restart without persistence
    this puts it back. Returns how many orgs are suspended.
    """
    with engine.connect() as connection:
        rows = connection.execute(
            select(OrgSuspension.org_id, OrgSuspension.customer_id).where(
                OrgSuspension.suspended.is_(True)
            )
        ).all()
    pipe = redis.pipeline(transaction=False)
    for org_id, customer_id in rows:
        pipe.set(keys.suspended_org(org_id), "restored")
        if customer_id:
            for key in keys.suspended_customer_everywhere(customer_id):
                pipe.set(key, "restored")
    pipe.execute()
    return len(rows)
