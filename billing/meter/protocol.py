"""Billing's request-path contract with the gateway: admission before forwarding, usage after.

The gateway builds an ``AdmissionRequest`` per request, takes its admission before
forwarding: ``Meter.admit_ready`` where billing admits it at once, else ``Meter.admit``
(which may raise ``AdmissionRefused``), and settles exactly once when the
response has ended, however it ended: ``Meter.settle`` waits until billing has the usage
(in Redis, or spooled), ``Meter.settle_nowait`` hands it over and returns (for an answer
already sent: the settlement goes with the others of the moment, its failure is logged).
Money never crosses this boundary as a float. Reading usage back is a separate contract
(``billing.ledger.reporting``), so nothing on the request path touches the SQL ledger. This
module imports nothing from billing (the real meter comes from
``billing.contract.create_meter``, which re-exports this contract to the gateway), so both
sides depend on it without a cycle.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal, Protocol

from serving.vocabulary import Tier

#: ``max_duration``: the gateway ended the request at its maximum total duration (what was
#: generated until then is billed).
Outcome = Literal["complete", "client_disconnect", "upstream_error", "max_duration"]


@dataclass(slots=True)
class AdmissionRequest:
    """Read-only once made (not ``frozen``: a frozen dataclass sets each field through
    ``object.__setattr__``, 4x the cost of making it, on every request's path)."""

    request_id: str
    org_id: str
    key_id: str
    plan: str
    #: The tier that will serve the request (billing follows the tier actually served).
    tier: Tier
    #: Public model id as the client asked for it (``composer-2.5``, ``composer-2.5-fast``...).
    model: str
    #: The gateway's count of prompt tokens over every prompt of the request (an upper-bound
    #: estimate is fine; it must not be lower than what vLLM will count).
    prompt_tokens: int
    #: The most output tokens the whole request may produce: every prompt x every choice
    #: (``n``) x ``max_tokens`` after the tier's and the model's caps.
    max_output_tokens: int
    customer_id: str | None = None
    #: The longest the request may run before the gateway ends it (None: no limit). Billing
    #: keeps the reservation alive while the request runs, but never past this (plus one
    #: reservation TTL), so a request that is never settled cannot hold budget forever.
    max_duration_s: float | None = None


@dataclass
class Admission:
    request: AdmissionRequest
    #: Headers for the response (``x-ratelimit-*``); sent on success and refusal alike.
    headers: dict[str, str] = field(default_factory=dict)
    #: Worst-case cost held against the org until ``settle``; integer nano-USD.
    reserved_nano_usd: int = 0
    #: Billing's own handle for the reservation; opaque to the gateway.
    reservation_id: str | None = None
    #: About how many more requests like this one the key's rate limits and the org's
    #: budget admitted right after it (None: not known, e.g. admitted without Redis). The
    #: gateway sends a key's next request upstream while its admission is still on the way
    #: only where this was comfortably above one (``gateway.api.admission``).
    headroom: int | None = None
    #: Billing's handle on the lease the request was admitted on (None: admitted alone);
    #: opaque to the gateway.
    lease: object | None = None


RefusalCode = Literal["rate_limit_exceeded", "insufficient_quota", "billing_unavailable"]


class AdmissionRefused(Exception):
    """The request must not be forwarded; the gateway answers ``status_code`` with this body.

    429 for limits and quota; 503 (``billing_unavailable``, with a retry-after) when
    billing cannot account for the request, e.g. Redis is unreachable past the allowance.
    """

    def __init__(
        self,
        message: str,
        *,
        code: RefusalCode,
        retry_after_s: int | None = None,
        headers: dict[str, str] | None = None,
        status_code: int = 429,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.retry_after_s = retry_after_s
        self.headers = dict(headers or {})
        self.status_code = status_code


@dataclass(slots=True)
class UsageReport:
    """Read-only once made (not ``frozen``, for the cost, as ``AdmissionRequest``)."""

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
    #: Of the completion tokens, those spent reasoning (None: the engine did not say).
    reasoning_tokens: int | None = None
    #: The client's own ``x-request-id``, if it sent one (its receipt can be found by it).
    client_request_id: str | None = None


class Meter(Protocol):
    def admit_ready(self, request: AdmissionRequest) -> Admission | None:
        """The request's admission if billing can make it without a wait (on a busy key's
        lease); None: ``admit`` it."""
        ...

    async def admit(self, request: AdmissionRequest) -> Admission: ...

    async def settle(self, admission: Admission, usage: UsageReport) -> None: ...

    def settle_nowait(self, admission: Admission, usage: UsageReport) -> None: ...

    def usage_cost(self, usage: UsageReport) -> dict[str, Any] | None:
        """What the request costs, for its answer's ``usage.cstack_cost`` (JSON-ready,
        integer nano-USD), priced as its usage will be billed; None where nothing is
        metered or it cannot be priced. Never raises."""
        ...

    async def aclose(self) -> None: ...


class UnmeteredMeter:
    """Admits everything and records nothing: the gateway with billing switched off."""

    def admit_ready(self, request: AdmissionRequest) -> Admission | None:
        return Admission(request=request)

    async def admit(self, request: AdmissionRequest) -> Admission:
        return Admission(request=request)

    async def settle(self, admission: Admission, usage: UsageReport) -> None:
        return None

    def settle_nowait(self, admission: Admission, usage: UsageReport) -> None:
        return None

    def usage_cost(self, usage: UsageReport) -> dict[str, Any] | None:
        return None

    async def aclose(self) -> None:
        return None
