"""Billing and the key store on a real Redis Cluster (three primaries with a replica each):
orgs spread over the primaries by shard, each metered exactly; suspensions and keys work;
and a primary killed mid-traffic loses no money: what it had not replicated is spooled
and lands, once, on the replica that took over."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from openai import AuthenticationError, OpenAI
from sqlalchemy import Engine, func, select

from billing.ledger import UsageRow, make_engine, migrate
from billing.ledger.consumer import UsageStreamConsumer
from billing.meter.events import usage_event
from billing.meter.protocol import Admission, AdmissionRefused
from billing.meter.redis_meter import RedisMeter
from billing.prices.periods import period_of
from billing.redis.client import RedisUrlError, async_client, parse_redis_url, sync_client
from billing.settings import BillingSettings
from billing.stripe.webhooks import WebhookService
from billing.worker import broker_url
from gateway.access.keys import KeyStore
from tests.support.builders import admission_request, usage_for
from tests.support.fakes.valkey_cluster import ValkeyCluster
from tests.support.gateway_processes import gateway_processes

on_session_loop = pytest.mark.asyncio(loop_scope="session")

#: Per request: 100 prompt tokens at 3000 nano-USD and 5 completion tokens at 15000.
COST = 100 * 3000 + 5 * 15000


@pytest.fixture(scope="module")
def cluster() -> Iterator[ValkeyCluster]:
    cluster = ValkeyCluster().start()
    yield cluster
    cluster.stop()


@pytest.fixture
def settings(billing_settings: BillingSettings, cluster: ValkeyCluster) -> BillingSettings:
    return billing_settings.model_copy(update={"redis_url": cluster.url})


@pytest.fixture
async def meter(settings: BillingSettings) -> AsyncIterator[RedisMeter]:
    meter = RedisMeter(settings)
    yield meter
    await meter.aclose()


def ledger(settings: BillingSettings) -> Engine:
    engine = make_engine(settings.ledger_url)
    migrate(engine)
    return engine


def ledger_costs(engine: Engine) -> dict[str, int]:
    """Per org: the allowance the ledger charged."""
    with engine.connect() as connection:
        rows = connection.execute(
            select(UsageRow.org_id, func.sum(UsageRow.allowance_cost_nano_usd)).group_by(
                UsageRow.org_id
            )
        ).all()
    return {org: int(total) for org, total in rows}


async def admit_and_settle(meter: RedisMeter, org: str, n: int) -> list[Admission]:
    requests = [admission_request(org=org, key=f"key-{org}", prompt=100) for _ in range(n)]
    admissions = list(await asyncio.gather(*(meter.admit(r) for r in requests)))
    await asyncio.gather(
        *(
            meter.settle(a, usage_for(r, completion=5))
            for a, r in zip(admissions, requests, strict=True)
        )
    )
    return admissions


async def budget(meter: RedisMeter, org: str, period: str) -> dict[str, int]:
    raw = await meter.redis.hgetall(meter.keys.budget_prefix(org) + period)
    return {k.decode(): int(v) for k, v in raw.items()}


def test_cluster_urls_are_parsed_and_refused_plainly() -> None:
    target = parse_redis_url(
        "rediss-cluster://u:p%40ss@10.0.0.1:7000,[::1]:7001?ssl_cert_reqs=none"
    )
    assert target.cluster and target.nodes == (("10.0.0.1", 7000), ("::1", 7001))
    assert target.node_url == "rediss://u:p%40ss@10.0.0.1:7000?ssl_cert_reqs=none"
    assert target.url_for("::1", 7001) == "rediss://u:p%40ss@[::1]:7001?ssl_cert_reqs=none"
    assert not parse_redis_url("redis://:pw@127.0.0.1:6379/2").cluster
    with pytest.raises(RedisUrlError, match="only database 0"):
        parse_redis_url("redis-cluster://10.0.0.1:7000/3")
    with pytest.raises(RedisUrlError, match="bad node 'x:y'"):
        parse_redis_url("redis-cluster://x:y")
    with pytest.raises(ValueError, match="CSTACK_CELERY_BROKER_URL"):
        broker_url(BillingSettings(redis_url="redis-cluster://127.0.0.1:7000"))
    assert (
        broker_url(
            BillingSettings(
                redis_url="redis-cluster://127.0.0.1:7000",
                celery_broker_url="redis://broker:6379/0",
            )
        )
        == "redis://broker:6379/0"
    )


@on_session_loop
async def test_orgs_spread_over_the_primaries_and_each_is_metered_exactly(
    meter: RedisMeter, settings: BillingSettings, cluster: ValkeyCluster
) -> None:
    orgs = [f"org-cluster-{i}" for i in range(12)]
    admitted = await asyncio.gather(*(admit_and_settle(meter, org, 4) for org in orgs))
    period = str(admitted[0][0].reservation_id).split("/")[0]
    for org in orgs:
        assert await budget(meter, org, period) == {"reserved": 0, "used": 4 * COST}
    primaries = {cluster.primary_of(meter.keys.budget_prefix(org)) for org in orgs}
    assert len(primaries) == 3  # 12 orgs on 16 shards reach every primary

    engine = ledger(settings)
    consumer = UsageStreamConsumer(sync_client(settings.redis_url), engine, settings)
    result = consumer.drain(max_seconds=30)
    assert (result.inserted, result.dead_lettered) == (48, 0)
    assert ledger_costs(engine) == {org: 4 * COST for org in orgs}
    assert consumer.drain(max_seconds=30).read == 0


@on_session_loop
async def test_busy_keys_are_admitted_on_leases_on_every_shard_and_metered_exactly(
    settings: BillingSettings,
) -> None:
    meter = RedisMeter(settings.model_copy(update={"admission_lease_lifetime_ms": 30_000}))
    orgs = [f"org-lease-{i}-{time.time_ns()}" for i in range(6)]
    leased = 0
    periods: set[str] = set()

    async def busy(org: str) -> None:
        nonlocal leased
        for _ in range(12):
            request = admission_request(org=org, key=f"key-{org}", prompt=100)
            admission = meter.admit_ready(request)
            leased += admission is not None
            admission = admission or await meter.admit(request)
            periods.add(str(admission.reservation_id).split("/")[0])
            await meter.settle(admission, usage_for(request, completion=5))
            await asyncio.sleep(0.01)

    try:
        await asyncio.gather(*(busy(org) for org in orgs))
    finally:
        await meter.aclose()  # gives back what no request took
    assert leased >= len(orgs)
    (period,) = periods
    for org in orgs:
        assert await budget(meter, org, period) == {"reserved": 0, "used": 12 * COST}
    engine = ledger(settings)
    consumer = UsageStreamConsumer(sync_client(settings.redis_url), engine, settings)
    consumer.drain(max_seconds=30)
    costs = ledger_costs(engine)
    assert {org: costs.get(org) for org in orgs} == {org: 12 * COST for org in orgs}


@on_session_loop
async def test_the_budget_cap_holds_on_a_cluster_as_on_one_redis(
    meter: RedisMeter, billing_settings: BillingSettings
) -> None:
    """The "tiny" plan's cap admits as many of these requests on a cluster as on one Redis."""
    single = RedisMeter(billing_settings)
    try:
        counts = []
        org = f"org-cap-{time.time_ns()}"  # one Redis keeps its budgets from earlier runs
        for each in (meter, single):
            admitted = 0
            for _ in range(50):
                try:
                    await each.admit(admission_request(org=org, plan="tiny"))
                    admitted += 1
                except AdmissionRefused as refusal:
                    assert refusal.code == "insufficient_quota"
            counts.append(admitted)
    finally:
        await single.aclose()
    assert counts[0] == counts[1] < 50


@on_session_loop
async def test_a_suspension_by_webhook_reaches_every_shard(
    meter: RedisMeter, settings: BillingSettings
) -> None:
    """A customer's unpaid invoice suspends each of its orgs, whatever shard each is on."""
    orgs = [f"org-unpaid-{i}" for i in range(6)]
    assert len({meter.keys.tag(org) for org in orgs}) > 1
    webhooks = WebhookService(settings)
    created = int(time.time())
    invoice = {"customer": "cus_cluster"}
    await webhooks.handle(
        {
            "id": "evt_fail",
            "type": "invoice.payment_failed",
            "created": created,
            "data": {"object": invoice},
        }
    )
    for org in orgs:
        with pytest.raises(AdmissionRefused, match="suspended"):
            await meter.admit(admission_request(org=org, customer="cus_cluster"))
    await meter.admit(admission_request(org=orgs[0], customer="cus_other"))
    await webhooks.handle(
        {
            "id": "evt_paid",
            "type": "invoice.paid",
            "created": created + 1,
            "data": {"object": invoice},
        }
    )
    for org in orgs:
        await meter.admit(admission_request(org=org, customer="cus_cluster"))


@on_session_loop
async def test_the_key_store_works_on_a_cluster(cluster: ValkeyCluster) -> None:
    redis = async_client(cluster.url)
    store = KeyStore(redis, "pro")
    try:
        org = await store.create_org(f"org-keys-{time.time_ns()}")
        epoch = await store.epoch()
        token, record = await store.create_key(org.org_id, name="ci")
        assert (await store.verify(token)) == record
        assert [k.key_id for k in await store.list_keys(org.org_id)] == [record.key_id]
        await store.update_org(org.org_id, default_tier="standard")
        await store.revoke_key(record.key_id)
        assert await store.verify(token) is None
        assert await store.epoch() == epoch + 2
    finally:
        await redis.aclose()  # type: ignore[attr-defined]


@on_session_loop
async def test_a_primary_killed_mid_traffic_loses_no_money(
    billing_settings: BillingSettings, tmp_path: Path
) -> None:
    """SIGKILL the primary of an org's shard while requests run: admission takes the
    outage allowance (or answers 503) until its replica takes over; settlements that no
    replica acknowledged are spooled and replayed. The ledger then holds every settled
    request once, and the new primary's budget equals the ledger's charge."""
    cluster = ValkeyCluster().start()
    settings = billing_settings.model_copy(
        update={"redis_url": cluster.url, "redis_timeout_s": 1.0}
    )
    meter = RedisMeter(settings)
    org = "org-failover"
    settled: list[str] = []
    try:
        victim = cluster.primary_of(meter.keys.budget_prefix(org))
        settled += [a.request.request_id for a in await admit_and_settle(meter, org, 10)]
        cluster.kill(victim)
        spooled = False
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                settled += [a.request.request_id for a in await admit_and_settle(meter, org, 2)]
            except AdmissionRefused as refusal:
                assert refusal.status_code == 503
            spooled = spooled or meter.usage.spool.pending_count() > 0
            if spooled and _primary_is_up(cluster, meter, org, victim):
                break
            await asyncio.sleep(0.1)
        assert spooled  # the outage was seen, and what it could not settle was spooled
        cluster.wait_failover(meter.keys.budget_prefix(org))
        settled += [a.request.request_id for a in await admit_and_settle(meter, org, 10)]
        while meter.usage.spool.pending_count():
            await meter.usage.replay_spool()
            await asyncio.sleep(0.2)

        engine = ledger(settings)
        consumer = UsageStreamConsumer(sync_client(settings.redis_url), engine, settings)
        consumer.drain(max_seconds=30)
        with engine.connect() as connection:
            in_ledger = connection.execute(select(UsageRow.event_id)).scalars().all()
        assert sorted(in_ledger) == sorted(settled)
        period = time.strftime("%Y-%m", time.gmtime())
        assert (await budget(meter, org, period))["used"] == ledger_costs(engine)[org]
        assert ledger_costs(engine)[org] == len(settled) * COST
    finally:
        await meter.aclose()
        cluster.stop()


def _primary_is_up(cluster: ValkeyCluster, meter: RedisMeter, org: str, victim: int) -> bool:
    try:
        return cluster.primary_of(meter.keys.budget_prefix(org)) != victim
    except AssertionError:
        return False


@on_session_loop
async def test_a_usage_event_spooled_before_sharding_replays_onto_its_orgs_shard(
    meter: RedisMeter,
) -> None:
    """A spool written by a release before sharding names the org's old budget prefix,
    not the org: its replay settles it on the org's shard all the same."""
    request = admission_request(org="org-spooled-long-ago", prompt=100)
    event = usage_event(
        meter.book,
        Admission(request=request, reserved_nano_usd=0),
        usage_for(request, completion=5),
    )
    legacy = {
        "budget_prefix": "cstack:budget:{org-spooled-long-ago}:",
        "period": period_of(event.started_at),
        "event_id": event.event_id,
        "allowance_nano_usd": event.allowance_cost_nano_usd,
        "event": event.model_dump_json(),
    }
    meter.usage.spool.append_all([legacy])
    assert await meter.usage.replay_spool() == 1
    period = period_of(event.started_at)
    assert await budget(meter, "org-spooled-long-ago", period) == {"used": COST}


@pytest.mark.vllm
@on_session_loop
async def test_gateways_on_a_cluster_serve_meter_and_revoke(
    settings: BillingSettings, vllm_url: str, tmp_path: Path
) -> None:
    """Two real gateway processes on the cluster, through the openai SDK: keys made in the
    cluster authenticate, each answer is metered into the ledger at its reported tokens,
    and a revocation reaches both gateways."""
    redis = async_client(settings.redis_url)
    store = KeyStore(redis, "metered")
    await store.create_org("org-cluster-gw", plan="metered")
    token, record = await store.create_key("org-cluster-gw", plan="metered")
    values = {**settings.model_dump(), "revocation_poll_s": 0.2}
    with gateway_processes(values, vllm_url, tmp_path, count=2) as urls:
        answers = []
        for url in urls:
            client = OpenAI(base_url=f"{url}/v1", api_key=token, max_retries=0)
            answers.append(
                client.chat.completions.create(
                    model="composer-2.5",
                    messages=[{"role": "user", "content": "Say hello."}],
                    max_tokens=8,
                )
            )
        await store.revoke_key(record.key_id)
        await redis.aclose()  # type: ignore[attr-defined]
        for url in urls:
            client = OpenAI(base_url=f"{url}/v1", api_key=token, max_retries=0)
            deadline = time.monotonic() + 10
            while True:
                try:
                    client.models.list()
                except AuthenticationError:
                    break
                assert time.monotonic() < deadline, "the revocation never reached a gateway"
                await asyncio.sleep(0.2)

    engine = ledger(settings)
    UsageStreamConsumer(sync_client(settings.redis_url), engine, settings).drain(30)
    with engine.connect() as connection:
        rows = connection.execute(select(UsageRow.prompt_tokens, UsageRow.completion_tokens)).all()
    reported = [(a.usage.prompt_tokens, a.usage.completion_tokens) for a in answers if a.usage]
    assert sorted(rows) == sorted(reported) and len(rows) == 2


@on_session_loop
async def test_a_shard_moved_to_another_primary_mid_traffic_is_metered_exactly(
    meter: RedisMeter, settings: BillingSettings, cluster: ValkeyCluster
) -> None:
    """A resharding: the slot of an org's shard migrates, key batch by key batch, to
    another primary while the org's requests run. Calls follow ASK and MOVED; while the
    org's keys are split between the two (TRYAGAIN), admission takes the outage allowance
    and settlements spool. Afterwards the budget on the new primary and the ledger both
    hold every settled request exactly once."""
    org = f"org-resharded-{time.time_ns()}"
    budget_key = meter.keys.budget_prefix(org)
    source = cluster.primary_of(budget_key)
    target = next(i for i in range(3) if i != source)
    settled = [a.request.request_id for a in await admit_and_settle(meter, org, 5)]

    async def traffic() -> None:
        for _ in range(2):
            request = admission_request(org=org, key=f"key-{org}", prompt=100)
            admission = await meter.admit(request)  # never refused: allowance meanwhile
            await meter.settle(admission, usage_for(request, completion=5))
            settled.append(request.request_id)

    with cluster.client(source) as src, cluster.client(target) as dst:
        slot = src.execute_command("CLUSTER KEYSLOT", budget_key)
        src_id = src.execute_command("CLUSTER MYID").decode()
        dst_id = dst.execute_command("CLUSTER MYID").decode()
        dst.execute_command("CLUSTER SETSLOT", slot, "IMPORTING", src_id)
        src.execute_command("CLUSTER SETSLOT", slot, "MIGRATING", dst_id)
        await traffic()
        while keys := src.execute_command("CLUSTER GETKEYSINSLOT", slot, 5):
            src.execute_command(
                "MIGRATE", "127.0.0.1", cluster.nodes[target].port, "", 0, 5000,
                "AUTH", cluster.password, "KEYS", *keys,
            )  # fmt: skip
            await traffic()
        for index in range(3):
            with cluster.client(index) as primary:
                primary.execute_command("CLUSTER SETSLOT", slot, "NODE", dst_id)
    assert cluster.primary_of(budget_key) == target
    assert meter.local_allowance.outage == 1  # the keys were split for a while: TRYAGAIN
    settled += [a.request.request_id for a in await admit_and_settle(meter, org, 5)]
    while meter.usage.spool.pending_count():
        await meter.usage.replay_spool()
        await asyncio.sleep(0.2)

    period = time.strftime("%Y-%m", time.gmtime())
    assert (await budget(meter, org, period))["used"] == len(settled) * COST
    engine = ledger(settings)
    UsageStreamConsumer(sync_client(settings.redis_url), engine, settings).drain(30)
    with engine.connect() as connection:
        rows = (
            connection.execute(select(UsageRow.event_id).where(UsageRow.org_id == org))
            .scalars()
            .all()
        )
    assert sorted(rows) == sorted(settled)
