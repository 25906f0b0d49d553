"""One admitted request on its way through the gateway (``Exchange``), the usage report
billing settles it on, and the errors that end it early: its maximum duration reached, or
an engine's failure (a non-200 answer, an in-stream error) in OpenAI's shape."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, NamedTuple

import pydantic_core

from billing.contract import Admission, Outcome, UsageReport
from gateway.access.auth import Principal
from gateway.errors import GatewayError, upstream_unavailable
from gateway.upstream.routing import PrefixKey
from gateway.upstream.tiers import TierRoute

logger = logging.getLogger(__name__)


@dataclass
class Exchange:
    """One admitted request on its way through the gateway."""

    request_id: str
    route: TierRoute
    principal: Principal
    #: None while an overlapped admission is on its way (``admitting``), or once refused.
    admission: Admission | None
    started_at: datetime
    #: Event-loop time at which the request has run its maximum duration.
    deadline: float
    #: Sequences the engine runs for it (prompts x n): the engine slots it takes.
    sequences: int = 1
    #: Its prompt prefix, where the pool routes by prefix.
    prefix: PrefixKey | None = None
    started: float = field(default_factory=time.perf_counter)
    settled: bool = False
    #: The overlapped admission still on its way (``gateway.api.admission``).
    admitting: asyncio.Task[Admission] | None = None
    #: The client's own ``x-request-id``, if it sent one (kept on the request's receipt).
    client_request_id: str | None = None
    #: ``time.perf_counter()`` at the request's arrival, and the seconds since spent
    #: waiting on the upstream (connecting, its engine slots, its head and body): what is
    #: left of the time is the gateway's own overhead.
    arrived: float = field(default_factory=time.perf_counter)
    upstream_s: float = 0.0
    #: The report its answer's cost was priced from (``Relay.usage_cost``): settled as is
    #: when the request completes on the same counts.
    priced: UsageReport | None = None

    def overhead_s(self) -> float:
        """The gateway's own time so far: since arrival, less the upstream's."""
        return max(0.0, time.perf_counter() - self.arrived - self.upstream_s)

    @property
    def headers(self) -> dict[str, str]:
        """The admission's response headers (``x-ratelimit-*``), once it is known."""
        return self.admission.headers if self.admission is not None else {}


MAX_DURATION_CODE = "max_duration_exceeded"
#: The gateway's own time for a request, in milliseconds (``Exchange.overhead_s``).
OVERHEAD_HEADER = "x-cstack-overhead-ms"


class UsageCounts(NamedTuple):
    """What billing takes of vLLM's usage: its token counts, and the reasoning tokens when
    its usage says them."""

    prompt: int
    cached: int
    completion: int
    reasoning: int | None

    @classmethod
    def of(cls, usage: dict[str, Any]) -> UsageCounts:
        details = usage.get("completion_tokens_details")
        reasoning = details.get("reasoning_tokens") if isinstance(details, dict) else None
        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
        return cls(
            int(usage.get("prompt_tokens") or 0),
            int(cached or 0),
            int(usage.get("completion_tokens") or 0),
            reasoning if isinstance(reasoning, int) and reasoning >= 0 else None,
        )

    @classmethod
    def in_report(cls, report: UsageReport) -> UsageCounts:
        return cls(
            report.prompt_tokens,
            report.cached_tokens,
            report.completion_tokens,
            report.reasoning_tokens,
        )


def usage_report(exchange: Exchange, outcome: Outcome, counts: UsageCounts) -> UsageReport:
    """The request's usage as billing takes it."""
    key = exchange.principal.key
    return UsageReport(
        request_id=exchange.request_id,
        org_id=key.org_id,
        key_id=key.key_id,
        model=exchange.route.public_model,
        tier=exchange.route.tier,
        prompt_tokens=counts.prompt,
        cached_tokens=counts.cached,
        completion_tokens=counts.completion,
        started_at=exchange.started_at,
        ended_at=datetime.now(UTC),
        outcome=outcome,
        customer_id=exchange.principal.customer_id,
        reasoning_tokens=counts.reasoning,
        client_request_id=exchange.client_request_id,
    )


def max_duration_exceeded(exchange: Exchange) -> GatewayError:
    """504, and no retry: the same request would run into the same limit."""
    return GatewayError(
        504,
        "the request reached the gateway's maximum duration and was ended; what was "
        "generated until then is billed. Lower max_tokens, or stream the answer.",
        type="server_error",
        code=MAX_DURATION_CODE,
        headers={"x-should-retry": "false", **exchange.headers},
    )


def stream_error(error: dict[str, Any] | None) -> GatewayError:
    """vLLM's in-stream error (or a stream that ended without one) as an error answer."""
    if error is None:
        return upstream_unavailable("upstream ended the answer early", 502)
    code = error.get("code")
    status = code if isinstance(code, int) and 400 <= code < 600 else 500
    return upstream_error(status, pydantic_core.to_json({"error": error}))


def upstream_error(status: int, content: bytes) -> GatewayError:
    """An upstream's non-200 answer in OpenAI's shape: a 4xx (the request was at fault)
    passes on as it is; a 5xx becomes a 502 whose message says nothing of the engine's
    insides (the engine's own message is logged)."""
    message, param, code = f"upstream answered {status}", None, None
    try:
        data = pydantic_core.from_json(content)
        detail = data.get("error", data) if isinstance(data, dict) else {}
        if isinstance(detail, dict):
            message = str(detail.get("message") or message)
            param = detail.get("param") if isinstance(detail.get("param"), str) else None
            code = str(detail["code"]) if detail.get("code") is not None else None
    except ValueError:
        pass
    if status >= 500 or status < 400:
        logger.warning("upstream answered %d: %s", status, message[:500])
        return GatewayError(
            502, "The model server failed the request.", type="server_error", code="upstream_error"
        )
    return GatewayError(status, message, param=param, code=code)
