"""The usage event: one per request, keyed by the request id, priced at the request's start.

It carries both the list cost and the allowance cost (list / the promotion's multiplier)
so that the ledger, invoices and Stripe never have to re-price history with a newer price
book. How much of the allowance a request got is the ledger's to say (billing.allowance):
it depends on the month's other requests.
"""

from __future__ import annotations

from datetime import UTC, datetime
from fractions import Fraction
from typing import Any

import msgspec
import pydantic_core
from pydantic import AliasChoices, BaseModel, ConfigDict, Field, field_validator

from billing.ledger.reporting import RECEIPTS_PATH
from billing.meter.protocol import Admission, Outcome, UsageReport
from billing.prices.pricing import Charge, PriceBook, charge
from serving.vocabulary import Tier

EVENT_SCHEMA_VERSION = 1


def _as_utc(value: datetime) -> datetime:
    """Naive timestamps are UTC; everything is stored and compared in UTC."""
    if value.tzinfo is UTC:  # the gateway's own clock: as it is
        return value
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


class UsageEvent(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    schema_version: int = EVENT_SCHEMA_VERSION
    event_id: str = Field(min_length=1, max_length=200)
    org_id: str = Field(min_length=1)
    key_id: str
    customer_id: str | None = None
    plan: str
    model: str
    tier: Tier
    prompt_tokens: int = Field(ge=0)
    cached_tokens: int = Field(ge=0)
    completion_tokens: int = Field(ge=0)
    #: Of the completion tokens, those spent reasoning (None: vLLM did not say).
    reasoning_tokens: int | None = Field(default=None, ge=0)
    #: The client's own ``x-request-id``, if it sent one.
    client_request_id: str | None = Field(default=None, max_length=128)
    list_cost_nano_usd: int = Field(ge=0)
    #: Events of releases before the promotion rule name it ``allowance_consumed_nano_usd``.
    allowance_cost_nano_usd: int = Field(
        ge=0,
        validation_alias=AliasChoices("allowance_cost_nano_usd", "allowance_consumed_nano_usd"),
    )
    #: "2x usage" during a promotion: allowance cost x multiplier = list cost.
    promotion_multiplier: str = "1"
    promotion_id: str | None = None
    price_version: str
    started_at: datetime
    ended_at: datetime
    outcome: Outcome

    @field_validator("started_at", "ended_at")
    @classmethod
    def _utc(cls, value: datetime) -> datetime:
        return _as_utc(value)

    @property
    def multiplier(self) -> Fraction:
        return Fraction(self.promotion_multiplier)


def usage_charge(book: PriceBook, usage: UsageReport) -> Charge:
    """What a finished request costs: the tokens vLLM produced, at the prices of its start."""
    return charge(
        book,
        tier=usage.tier,
        model=usage.model,
        prompt_tokens=usage.prompt_tokens,
        cached_tokens=usage.cached_tokens,
        completion_tokens=usage.completion_tokens,
        at=usage.started_at,
    )


def usage_event_fields(
    book: PriceBook, admission: Admission, usage: UsageReport, priced: Charge | None = None
) -> dict[str, Any]:
    """Price a finished request (by the tokens vLLM actually produced) into its event's
    fields, in ``UsageEvent``'s order and form (``priced``: its ``usage_charge``, when
    already made for its answer).

    The gateway serialises these straight to the stream (``usage_event_json``): validating
    a model it has just built from its own numbers cost a metered request more than pricing
    it did. Whoever reads the event validates it (``UsageEvent.model_validate_json``: the
    ledger writer, which dead-letters what does not validate). ``usage_event`` is the
    validated form of the same fields.
    """
    if priced is None:
        priced = usage_charge(book, usage)
    return {
        "schema_version": EVENT_SCHEMA_VERSION,
        "event_id": usage.request_id,
        "org_id": usage.org_id,
        "key_id": usage.key_id,
        "customer_id": usage.customer_id,
        "plan": admission.request.plan,
        "model": usage.model,
        "tier": usage.tier,
        "prompt_tokens": usage.prompt_tokens,
        "cached_tokens": usage.cached_tokens,
        "completion_tokens": usage.completion_tokens,
        "reasoning_tokens": usage.reasoning_tokens,
        "client_request_id": usage.client_request_id,
        "list_cost_nano_usd": priced.list_cost_nano,
        "allowance_cost_nano_usd": priced.allowance_cost_nano,
        "promotion_multiplier": str(priced.usage_multiplier),
        "promotion_id": priced.promotion_id,
        "price_version": priced.price_version,
        "started_at": _as_utc(usage.started_at),
        "ended_at": _as_utc(usage.ended_at),
        "outcome": usage.outcome,
    }


_encode_event = msgspec.json.Encoder().encode


def usage_event_json(fields: dict[str, Any]) -> str:
    """``usage_event_fields`` as the JSON ``UsageEvent.model_dump_json`` writes for them:
    by msgspec (3x as fast, the same bytes for these fields), or by pydantic-core for a
    value msgspec will not write (a type it does not know)."""
    try:
        return _encode_event(fields).decode()
    except (msgspec.EncodeError, OverflowError, TypeError):
        return pydantic_core.to_json(fields).decode()


def usage_event(book: PriceBook, admission: Admission, usage: UsageReport) -> UsageEvent:
    """The validated event of a finished request."""
    return UsageEvent(**usage_event_fields(book, admission, usage))


def answer_cost(
    book: PriceBook, usage: UsageReport, priced: Charge | None = None
) -> dict[str, Any]:
    """What a request costs, as its answer's ``usage.cstack_cost``: priced as its usage
    event is (the same tokens, tier, model and start), so the ledger says the same. How
    much the allowance covers is the month's to say: its receipt, at ``receipt``."""
    if priced is None:
        priced = usage_charge(book, usage)
    promotion = (
        {"id": priced.promotion_id, "usage_multiplier": str(priced.usage_multiplier)}
        if priced.promotion_id
        else None
    )
    return {
        "currency": "usd",
        "price_version": priced.price_version,
        "list_cost_nano_usd": priced.list_cost_nano,
        "promotion": promotion,
        "allowance_cost_nano_usd": priced.allowance_cost_nano,
        "receipt": f"{RECEIPTS_PATH}/{usage.request_id}",
    }


def _priced_on(usage: UsageReport) -> tuple[object, ...]:
    """What a usage's charge depends on."""
    return (
        usage.tier,
        usage.model,
        usage.prompt_tokens,
        usage.cached_tokens,
        usage.completion_tokens,
        usage.started_at,
    )


class AnswerCharges:
    """Answers priced for their ``cstack_cost``, by request id, until their settlement,
    which takes the charge back for the same usage rather than pricing it again (at most
    ``limit`` kept: a request that never settled must not hold its entry for ever)."""

    def __init__(self, limit: int = 10_000) -> None:
        self._limit = limit
        self._charges: dict[str, tuple[tuple[object, ...], Charge]] = {}

    def remember(self, usage: UsageReport, priced: Charge) -> None:
        if len(self._charges) >= self._limit:
            self._charges.clear()  # only a saving: the settlements price them anew
        self._charges[usage.request_id] = (_priced_on(usage), priced)

    def take(self, usage: UsageReport) -> Charge | None:
        """The charge remembered for the request, if it priced the same usage."""
        remembered = self._charges.pop(usage.request_id, None)
        if remembered is None or remembered[0] != _priced_on(usage):
            return None
        return remembered[1]
