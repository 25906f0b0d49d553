"""The report a completed request settles on: the one its answer's cost was priced from,
when its usage has not changed since; a report of its own otherwise."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

from billing.contract import Admission, AdmissionRequest, UnmeteredMeter, UsageReport
from gateway.access.auth import Principal
from gateway.access.keys import ApiKey
from gateway.api.exchange import Exchange
from gateway.api.relay import Relay
from gateway.metrics import GatewayMetrics
from gateway.upstream.tiers import TierRoute


class PricingMeter(UnmeteredMeter):
    """Keeps the reports it priced and the ones it settled."""

    def __init__(self) -> None:
        self.priced: list[UsageReport] = []
        self.settled: list[UsageReport] = []

    def usage_cost(self, usage: UsageReport) -> dict[str, Any] | None:
        self.priced.append(usage)
        return {"list_cost_nano_usd": 1}

    def settle_nowait(self, admission: Admission, usage: UsageReport) -> None:
        self.settled.append(usage)


def _exchange() -> Exchange:
    route = TierRoute("fast", "composer-2.5", "composer-2.5", 0, 4096)
    key = ApiKey("key-1", "org-1", "default", "k", 0.0)
    request = AdmissionRequest("req-1", "org-1", "key-1", "default", "fast", "composer-2.5", 9, 16)
    return Exchange(
        "req-1",
        route,
        Principal(key, None),
        Admission(request=request),
        datetime.now(UTC),
        deadline=1e18,
    )


def _usage(completion: int, reasoning: int | None = None) -> dict[str, Any]:
    usage: dict[str, Any] = {
        "prompt_tokens": 9,
        "completion_tokens": completion,
        "total_tokens": 9 + completion,
        "prompt_tokens_details": {"cached_tokens": 4},
    }
    if reasoning is not None:
        usage["completion_tokens_details"] = {"reasoning_tokens": reasoning}
    return usage


async def _settled(priced: dict[str, Any], settled: dict[str, Any], outcome: Any) -> PricingMeter:
    meter = PricingMeter()
    relay = Relay({"fast": None, "standard": None}, meter, GatewayMetrics())  # type: ignore[dict-item]
    exchange = _exchange()
    relay.usage_cost(exchange, priced)
    relay.settle_soon(exchange, outcome, settled)
    await asyncio.sleep(0)
    return meter


async def test_a_completed_request_settles_the_report_its_answer_was_priced_from() -> None:
    meter = await _settled(_usage(16, reasoning=3), _usage(16, reasoning=3), "complete")
    assert meter.settled[0] is meter.priced[0]
    report = meter.settled[0]
    assert (report.prompt_tokens, report.cached_tokens, report.completion_tokens) == (9, 4, 16)
    assert report.reasoning_tokens == 3


async def test_other_usage_or_another_ending_gets_a_report_of_its_own() -> None:
    for priced, settled, outcome in (
        (_usage(16), _usage(17), "complete"),
        (_usage(16, reasoning=3), _usage(16, reasoning=4), "complete"),
        (_usage(16), _usage(16), "client_disconnect"),
    ):
        meter = await _settled(priced, settled, outcome)
        report = meter.settled[0]
        assert report is not meter.priced[0]
        assert report.outcome == outcome
        assert report.completion_tokens == settled["completion_tokens"]
