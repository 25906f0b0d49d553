"""Test data for billing: admission requests, their usage reports, and usage events whose
cost the test worked out by hand."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from fractions import Fraction

from billing.meter.events import UsageEvent
from billing.meter.protocol import AdmissionRequest, UsageReport
from serving.vocabulary import Tier

#: The day the ledger tests' events start, in the month of the shipped price book.
LEDGER_DAY_ONE = datetime(2026, 11, 3, 10, 0, tzinfo=UTC)


def admission_request(
    *,
    org: str = "org-a",
    key: str = "key-a",
    plan: str = "pro",
    tier: Tier = "fast",
    prompt: int = 100,
    max_output: int = 50,
    customer: str | None = None,
    request_id: str | None = None,
) -> AdmissionRequest:
    return AdmissionRequest(
        request_id=request_id or f"req-{uuid.uuid4().hex}",
        org_id=org,
        key_id=key,
        plan=plan,
        tier=tier,
        model="composer-2.5",
        prompt_tokens=prompt,
        max_output_tokens=max_output,
        customer_id=customer,
    )


def usage_for(
    request: AdmissionRequest, *, completion: int, cached: int = 0, outcome: str = "complete"
) -> UsageReport:
    now = datetime.now(UTC)
    return UsageReport(
        request_id=request.request_id,
        org_id=request.org_id,
        key_id=request.key_id,
        model=request.model,
        tier=request.tier,
        prompt_tokens=request.prompt_tokens,
        cached_tokens=cached,
        completion_tokens=completion,
        started_at=now,
        ended_at=now,
        outcome=outcome,  # type: ignore[arg-type]
        customer_id=request.customer_id,
    )


def hand_event(
    org: str,
    request_id: str,
    started: datetime,
    *,
    tier: str,
    version: str,
    prompt: int,
    completion: int,
    list_cost: int,
    cached: int = 0,
    multiplier: str = "1",
    plan: str = "hand",
    key: str = "key-hand",
    model: str = "composer-2.5",
    client_request_id: str | None = None,
) -> UsageEvent:
    """A usage event whose list cost the test worked out by hand (not by the pricing code);
    its allowance cost is that / ``multiplier``, a promotion's when it is not 1."""
    usage_multiplier = Fraction(multiplier)
    return UsageEvent(
        event_id=f"{org}-{request_id}",
        org_id=org,
        key_id=key,
        customer_id=None,
        plan=plan,
        model=model,
        tier=tier,  # type: ignore[arg-type]
        prompt_tokens=prompt,
        cached_tokens=cached,
        completion_tokens=completion,
        client_request_id=client_request_id,
        list_cost_nano_usd=list_cost,
        allowance_cost_nano_usd=int(list_cost / usage_multiplier),
        promotion_multiplier=str(usage_multiplier),
        promotion_id="launch-week" if usage_multiplier != 1 else None,
        price_version=version,
        started_at=started,
        ended_at=started,
        outcome="complete",
    )


def ledger_event(
    event_id: str, *, tier: str = "fast", at: datetime = LEDGER_DAY_ONE, **overrides: object
) -> UsageEvent:
    """A usage event of org-ledger: 1000 prompt and 100 completion tokens at list price."""
    prices = {"fast": (3000, 15000), "standard": (500, 2500)}[tier]
    values: dict[str, object] = {
        "event_id": event_id,
        "org_id": "org-ledger",
        "key_id": "key-1",
        "customer_id": "cus_ledger",
        "plan": "pro",
        "model": "composer-2.5",
        "tier": tier,
        "prompt_tokens": 1000,
        "cached_tokens": 0,
        "completion_tokens": 100,
        "list_cost_nano_usd": 1000 * prices[0] + 100 * prices[1],
        "allowance_cost_nano_usd": 1000 * prices[0] + 100 * prices[1],
        "price_version": "2026-11-01",
        "started_at": at,
        "ended_at": at,
        "outcome": "complete",
    }
    values.update(overrides)
    return UsageEvent.model_validate(values)
