"""Billing's request-path contract with the gateway: admission before forwarding, usage after.

The gateway builds an ``AdmissionRequest`` per request, calls ``Meter.admit`` before
forwarding (which may raise ``AdmissionRefused``), and calls ``Meter.settle`` exactly once
when the response has ended, however it ended. Money never crosses this boundary as a
float. Reading usage back is a separate contract (``billing.reporting``), so nothing on the
request path touches the SQL ledger. This module imports nothing from billing (the real
meter comes from ``billing.create_meter``), so both sides depend on it without a cycle.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal, Protocol

from serving.tiers import Tier

Outcome = Literal["complete", "client_disconnect", "upstream_error"]


@dataclass(frozen=True)
class AdmissionRequest:
    request_id: str
    org_id: str
    key_id: str
    plan: str
    #: The tier that will serve the request (billing follows the tier actually served).
    tier: Tier
    #: Public model id as the client asked for it (``composer-2.5``, ``composer-2.5-fast``...).
    model: str
    #: The gateway's count of prompt tokens (an upper-bound estimate is fine).
    prompt_tokens: int
    #: The most output tokens the request may produce (after the tier's cap).
    max_output_tokens: int
    customer_id: str | None = None


@dataclass
class Admission:
    request: AdmissionRequest
    #: Headers for the response (``x-ratelimit-*``); sent on success and refusal alike.
    headers: dict[str, str] = field(default_factory=dict)
    #: Worst-case cost held against the org until ``settle``; integer nano-USD.
    reserved_nano_usd: int = 0
    #: Billing's own handle for the reservation; opaque to the gateway.
    reservation_id: str | None = None


class AdmissionRefused(Exception):
    """The request must not be forwarded; the gateway answers 429 with this body."""

    status_code = 429

    def __init__(
        self,
        message: str,
        *,
        code: Literal["rate_limit_exceeded", "insufficient_quota"],
        retry_after_s: int | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.retry_after_s = retry_after_s
        self.headers = dict(headers or {})


@dataclass(frozen=True)
class UsageReport:
    request_id: str
    org_id: str
    key_id: str
    model: str
    tier: Tier
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    started_at: datetime
    ended_at: datetime
    outcome: Outcome
    customer_id: str | None = None


class Meter(Protocol):
    async def admit(self, request: AdmissionRequest) -> Admission: ...

    async def settle(self, admission: Admission, usage: UsageReport) -> None: ...

    async def aclose(self) -> None: ...


class UnmeteredMeter:
    """Admits everything and records nothing: the gateway with billing switched off."""

    async def admit(self, request: AdmissionRequest) -> Admission:
        return Admission(request=request)

    async def settle(self, admission: Admission, usage: UsageReport) -> None:
        return None

    async def aclose(self) -> None:
        return None
