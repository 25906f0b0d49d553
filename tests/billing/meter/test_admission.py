"""Admission and settlement against the session's real Valkey: limits, refusals, the
reservation's lifecycle, suspension and the usage event each request emits."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from dataclasses import replace

import pytest

from billing.meter.protocol import AdmissionRefused
from billing.meter.redis_meter import RedisMeter
from billing.settings import BillingSettings
from tests.support.builders import admission_request, usage_for

pytestmark = pytest.mark.asyncio(loop_scope="session")


@pytest.fixture
async def meter(billing_settings: BillingSettings) -> AsyncIterator[RedisMeter]:
    meter = RedisMeter(billing_settings)
    yield meter
    await meter.aclose()


async def budget(meter: RedisMeter, org: str, period: str) -> dict[str, int]:
    raw = await meter.redis.hgetall(meter.keys.budget_prefix(org) + period)
    return {k.decode(): int(v) for k, v in raw.items()}


async def stream_events(meter: RedisMeter) -> list[dict[str, object]]:
    entries = []
    for stream in meter.keys.usage_streams():
        entries += await meter.redis.xrange(stream)
    return [json.loads(fields[b"event"]) for _, fields in entries]


async def test_admit_reserves_worst_case_and_settle_charges_actual(meter: RedisMeter) -> None:
    request = admission_request(org="org-settle", plan="pro", prompt=100, max_output=50)
    admission = await meter.admit(request)
    worst = 100 * 3000 + 50 * 15000
    assert admission.reserved_nano_usd == worst
    assert admission.headers["x-ratelimit-limit-requests"] == "600"
    assert admission.headers["x-ratelimit-remaining-requests"] == "599"
    assert admission.headers["x-ratelimit-remaining-tokens"] == str(2_000_000 - 150)
    # As many more like it fit under the key's rate limits and the org's budget: the
    # requests per minute bind first.
    assert admission.headroom == 599
    period = str(admission.reservation_id).split("/")[0]
    assert await budget(meter, "org-settle", period) == {"reserved": worst}

    await meter.settle(admission, usage_for(request, completion=20, cached=40))
    actual = 60 * 3000 + 40 * 3000 + 20 * 15000
    assert await budget(meter, "org-settle", period) == {"reserved": 0, "used": actual}
    (event,) = await stream_events(meter)
    assert event["event_id"] == request.request_id
    assert event["list_cost_nano_usd"] == actual
    assert event["allowance_cost_nano_usd"] == actual
    assert event["promotion_multiplier"] == "1"
    assert event["price_version"] == "2026-11-01"
    assert event["plan"] == "pro"
    assert (event["tier"], event["outcome"]) == ("fast", "complete")

    # A second settle of the same request (a retry in the gateway) changes nothing.
    await meter.settle(admission, usage_for(request, completion=20, cached=40))
    assert await budget(meter, "org-settle", period) == {"reserved": 0, "used": actual}
    assert len(await stream_events(meter)) == 1


async def test_failed_request_releases_its_reservation(meter: RedisMeter) -> None:
    request = admission_request(org="org-fail", plan="pro")
    admission = await meter.admit(request)
    period = str(admission.reservation_id).split("/")[0]
    await meter.settle(admission, usage_for(request, completion=0, outcome="upstream_error"))
    assert await budget(meter, "org-fail", period) == {"reserved": 0, "used": 100 * 3000}
    (event,) = await stream_events(meter)
    assert event["outcome"] == "upstream_error"


async def test_requests_per_minute_limit_refuses_with_retry_after(meter: RedisMeter) -> None:
    for _ in range(2):
        await meter.admit(
            admission_request(org="org-rpm", key="key-rpm", plan="limited", prompt=1, max_output=1)
        )
    with pytest.raises(AdmissionRefused) as refused:
        await meter.admit(
            admission_request(org="org-rpm", key="key-rpm", plan="limited", prompt=1, max_output=1)
        )
    assert refused.value.code == "rate_limit_exceeded"
    assert refused.value.retry_after_s is not None and 1 <= refused.value.retry_after_s <= 60
    assert refused.value.headers["retry-after"] == str(refused.value.retry_after_s)
    assert refused.value.headers["x-ratelimit-remaining-requests"] == "0"
    # Another key of the same org has its own limit.
    await meter.admit(
        admission_request(org="org-rpm", key="key-other", plan="limited", prompt=1, max_output=1)
    )


async def test_tokens_per_minute_limit(meter: RedisMeter) -> None:
    with pytest.raises(AdmissionRefused, match="more than the key's limit of 1000 tokens") as big:
        await meter.admit(
            admission_request(key="key-tpm", plan="limited", prompt=900, max_output=200)
        )
    assert big.value.code == "rate_limit_exceeded"
    await meter.admit(admission_request(key="key-tpm", plan="limited", prompt=500, max_output=300))
    with pytest.raises(AdmissionRefused) as refused:
        await meter.admit(
            admission_request(key="key-tpm", plan="limited", prompt=200, max_output=100)
        )
    assert refused.value.code == "rate_limit_exceeded"
    assert refused.value.retry_after_s is not None
    assert int(refused.value.headers["x-ratelimit-remaining-tokens"]) < 300


async def test_exhausted_budget_refuses_with_insufficient_quota(meter: RedisMeter) -> None:
    # tiny: $0.05 included, overage refused; each request's worst case is $0.00105.
    admitted = 0
    with pytest.raises(AdmissionRefused) as refused:
        for _ in range(100):
            await meter.admit(admission_request(org="org-tiny", plan="tiny"))
            admitted += 1
    assert admitted == 47  # floor(0.05 / 0.00105)
    assert refused.value.code == "insufficient_quota"
    assert refused.value.retry_after_s is None
    assert "x-ratelimit-limit-requests" in refused.value.headers


async def test_unsettled_reservations_expire(billing_settings: BillingSettings) -> None:
    meter = RedisMeter(billing_settings.model_copy(update={"reservation_ttl_s": 1}))
    try:
        for _ in range(47):
            await meter.admit(admission_request(org="org-crashed", plan="tiny"))
        with pytest.raises(AdmissionRefused):
            await meter.admit(admission_request(org="org-crashed", plan="tiny"))
        time.sleep(1.2)  # the gateway that held them "died"; their TTL runs out
        await meter.admit(admission_request(org="org-crashed", plan="tiny"))
    finally:
        await meter.aclose()


async def test_suspended_org_is_refused(meter: RedisMeter) -> None:
    await meter.redis.set(meter.keys.suspended_org("org-unpaid"), "evt_1")
    with pytest.raises(AdmissionRefused, match="suspended") as refused:
        await meter.admit(admission_request(org="org-unpaid"))
    assert refused.value.code == "insufficient_quota"
    assert refused.value.headers["x-ratelimit-limit-requests"] == "600"
    await meter.redis.delete(meter.keys.suspended_org("org-unpaid"))
    await meter.admit(admission_request(org="org-unpaid"))


async def test_unknown_plan_is_refused_by_name(meter: RedisMeter) -> None:
    with pytest.raises(AdmissionRefused, match="plan 'platinum' is not in the price book"):
        await meter.admit(admission_request(plan="platinum"))


async def test_a_request_in_flight_keeps_its_reservation_past_the_ttl(
    billing_settings: BillingSettings,
) -> None:
    """The process renews the reservations of its requests in flight (one call per third
    of the TTL), so a long stream keeps its money held; once settled it is not renewed,
    and a process that died (no renewals) lets its reservations lapse."""
    settings = billing_settings.model_copy(update={"reservation_ttl_s": 2})
    meter = RedisMeter(settings)
    dead = RedisMeter(settings)
    try:
        long_running = [await meter.admit(admission_request(org="org-long", plan="tiny"))]
        long_running += [await dead.admit(admission_request(org="org-long", plan="tiny"))]
        await dead.aclose()  # its renewals stop here, as if the gateway had crashed
        for _ in range(45):
            await meter.admit(admission_request(org="org-long", plan="tiny"))
        with pytest.raises(AdmissionRefused):
            await meter.admit(admission_request(org="org-long", plan="tiny"))
        await asyncio.sleep(5)  # two and a half TTLs: only renewals keep the live ones held
        # The dead process's one reservation lapsed: exactly one more request fits.
        await meter.admit(admission_request(org="org-long", plan="tiny"))
        with pytest.raises(AdmissionRefused):
            await meter.admit(admission_request(org="org-long", plan="tiny"))
        period = str(long_running[0].reservation_id).split("/")[0]
        held = await meter.redis.zrange(
            meter.keys.budget_prefix("org-long") + period + ":resv", 0, -1
        )
        assert long_running[0].request.request_id.encode() in held
        assert long_running[1].request.request_id.encode() not in held

        await meter.settle(long_running[0], usage_for(long_running[0].request, completion=50))
        assert len(meter.reservations) == 46  # settled: no longer renewed
    finally:
        await meter.aclose()


async def test_renewal_stops_after_the_requests_maximum_duration(
    billing_settings: BillingSettings,
) -> None:
    """A request that is never settled (a bug) is renewed for its maximum duration plus
    one TTL at most, so it cannot hold budget for ever."""
    meter = RedisMeter(billing_settings.model_copy(update={"reservation_ttl_s": 1}))
    try:
        request = admission_request(org="org-leak", plan="tiny")
        leaked = await meter.admit(replace(request, max_duration_s=0.0))
        assert await meter.reservations.renew_now() == 1
        time.sleep(1.1)
        assert await meter.reservations.renew_now() == 0
        assert len(meter.reservations) == 0
        assert leaked.reservation_id
    finally:
        await meter.aclose()


async def test_one_failed_renewal_call_does_not_stop_the_others(
    meter: RedisMeter, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Renewals go in batches (one per shard on a cluster): a batch whose call fails is
    reported after the others were renewed, not before."""
    import redis.exceptions

    monkeypatch.setattr("billing.meter.reservations.RENEW_BATCH", 1)
    broken = await meter.admit(admission_request(org="org-renew-a", plan="tiny"))
    healthy = await meter.admit(admission_request(org="org-renew-b", plan="tiny"))
    period = str(broken.reservation_id).split("/")[0]
    broken_key = meter.keys.budget_prefix("org-renew-a") + period + ":resv"
    healthy_key = meter.keys.budget_prefix("org-renew-b") + period + ":resv"
    before = await meter.redis.zscore(healthy_key, healthy.request.request_id)
    await meter.redis.delete(broken_key)
    await meter.redis.set(broken_key, "not a sorted set")  # its renewal fails: WRONGTYPE
    await asyncio.sleep(0.01)
    with pytest.raises(redis.exceptions.ResponseError, match="WRONGTYPE"):
        await meter.reservations.renew_now()
    after = await meter.redis.zscore(healthy_key, healthy.request.request_id)
    assert before is not None and after is not None and after > before


@pytest.mark.parametrize(
    ("prompt", "max_output", "refused_as"),
    [(100, 50, None), (100, 20_000, "more than the key's limit")],
)
async def test_tokens_per_minute_count_every_prompt_and_choice(
    meter: RedisMeter, prompt: int, max_output: int, refused_as: str | None
) -> None:
    """``max_output_tokens`` is the whole request's (prompts x n x max_tokens): the
    tokens-per-minute limit applies to all of it."""
    request = admission_request(key="key-tpm-shape", plan="limited", prompt=prompt,
                                max_output=max_output)  # fmt: skip
    if refused_as is None:
        admission = await meter.admit(request)
        assert admission.headers["x-ratelimit-remaining-tokens"] == str(1000 - 150)
        return
    with pytest.raises(AdmissionRefused, match=refused_as) as refused:
        await meter.admit(request)
    assert "fewer prompts" in refused.value.message


async def test_admission_follows_redis_month_when_the_gateway_clock_differs(
    meter: RedisMeter,
) -> None:
    """Budget keys are named by the gateway (so a cluster can route them) and checked by
    the script against Redis's clock: a gateway still in last month (clock skew at a month
    boundary) is told Redis's month and admits into it, once."""
    redis_month = meter._period
    meter._period = "1999-12"  # as if this gateway's clock were behind Redis's
    admission = await meter.admit(admission_request(org="org-skewed", prompt=100))
    assert str(admission.reservation_id).startswith(f"{redis_month}/")
    assert meter._period == redis_month
    assert (await budget(meter, "org-skewed", redis_month))["reserved"] > 0
    assert await budget(meter, "org-skewed", "1999-12") == {}
