"""The disk spool's replay contract, and the billing metrics the gateway's /metrics shows."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import REGISTRY

from billing.meter.protocol import AdmissionRefused
from billing.meter.redis_meter import RedisMeter
from billing.meter.spool import UsageSpool
from billing.settings import BillingSettings
from tests.support.builders import admission_request, usage_for

pytestmark = pytest.mark.asyncio(loop_scope="session")


async def test_spool_replays_everything_at_least_once(tmp_path: Path) -> None:
    spool = UsageSpool(tmp_path / "spool")
    for n in range(3):
        spool.append({"n": n})
    with spool.path.open("ab") as handle:  # a crash mid-write leaves a torn last line
        handle.write(b'{"n": 3, "trunc')
    sent: list[Any] = []
    failures = [ConnectionError("Redis went away again")]

    async def flaky(record: dict[str, Any]) -> None:
        if record["n"] == 1 and failures:
            sent.append({"n": "failed"})
            raise failures.pop()
        sent.append(record)

    with pytest.raises(ConnectionError):
        await spool.replay(flaky)
    assert spool.pending_count() == 3  # nothing dropped: the claimed file stays
    assert await spool.replay(flaky) == 3
    assert [r["n"] for r in sent] == [0, "failed", 0, 1, 2]
    assert spool.pending_files() == []
    spool.append({"n": 4})  # appends after a replay start a new file
    assert spool.pending_count() == 1


def sample(name: str, labels: dict[str, str] | None = None) -> float:
    value = REGISTRY.get_sample_value(name, labels or {})
    return 0.0 if value is None else value


@pytest.fixture
async def meter(billing_settings: BillingSettings) -> AsyncIterator[RedisMeter]:
    meter = RedisMeter(billing_settings)
    yield meter
    await meter.aclose()


async def test_billing_metrics_follow_the_contract(meter: RedisMeter) -> None:
    assert sample("cstack_price_nano_usd_per_token", {"tier": "fast", "direction": "input"}) == 3000
    assert (
        sample("cstack_price_nano_usd_per_token", {"tier": "standard", "direction": "output"})
        == 2500
    )
    admissions = sample("cstack_admission_seconds_count")
    events = sample("cstack_usage_events_total", {"tier": "fast", "outcome": "complete"})
    refusals = sample(
        "cstack_admission_refusals_total", {"tier": "fast", "code": "insufficient_quota"}
    )

    request = admission_request(org="org-metrics")
    await meter.settle(await meter.admit(request), usage_for(request, completion=3))
    with pytest.raises(AdmissionRefused):
        await meter.admit(admission_request(org="org-metrics", plan="nonexistent"))

    assert sample("cstack_admission_seconds_count") == admissions + 2
    assert (
        sample("cstack_usage_events_total", {"tier": "fast", "outcome": "complete"}) == events + 1
    )
    assert (
        sample("cstack_admission_refusals_total", {"tier": "fast", "code": "insufficient_quota"})
        == refusals + 1
    )
