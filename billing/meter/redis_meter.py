"""The real Meter: admission and settlement against Redis, usage events to a stream.

``admit`` runs one Lua script (rate limits, suspension, cost reservation), sharing a Redis
round trip with the other requests' calls of the moment (``billing.redis.batching``). ``settle``
runs another (release the reservation, count the actual cost, append the usage event),
one call for the settlements of a few milliseconds (``billing.meter.settlement``). Reservations
of requests in flight are renewed in the background, every third of their TTL
(``billing.meter.reservations``). When Redis is unreachable, settlement goes to the disk spool
(``billing.meter.usage_writer``) and admission refuses or admits on a bounded per-process
allowance, as configured (``billing.meter.outage``).

Keys are named by ``billing.meter.keyspace``. On a Redis Cluster (``billing.redis.cluster``) each
call goes to the primary of its org's shard: a settlement batch and a renewal make one
call per shard.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from datetime import UTC, datetime
from typing import Any, cast

from redis import exceptions as redis_errors

from billing import metrics
from billing.meter.events import (
    AnswerCharges,
    answer_cost,
    usage_charge,
    usage_event_fields,
    usage_event_json,
)
from billing.meter.keyspace import Keyspace
from billing.meter.lease_state import Lease, headroom
from billing.meter.leases import LEASE_SCRIPT, RETURN_LEASE_SCRIPT, Leases
from billing.meter.outage import SLOT_MOVING, LocalAllowance, billing_unavailable, unreachable
from billing.meter.protocol import Admission, AdmissionRefused, AdmissionRequest, UsageReport
from billing.meter.ratelimit_headers import admission_headers
from billing.meter.reservations import ReservationKeeper
from billing.meter.scripts import ADMIT, RENEW
from billing.meter.settlement import Record, SettlementQueue
from billing.meter.spool import UsageSpool
from billing.meter.usage_writer import REDIS_DOWN, SETTLE_SCRIPT, UsageWriter
from billing.prices.periods import period_of
from billing.prices.pricing import (
    PriceBook,
    PriceBookError,
    pricebook_from_path,
    worst_case_charge,
    worst_list_cost,
)
from billing.redis.batching import Script, ScriptBatcher
from billing.redis.client import AsyncClient, async_client, parse_redis_url
from billing.redis.cluster import ClusterScripts
from billing.redis.resp import RespConnection
from billing.settings import BillingSettings
from serving.vocabulary import TIERS

logger = logging.getLogger(__name__)

ADMIT_SCRIPT = Script(ADMIT)
RENEW_SCRIPT = Script(RENEW)


def _log_settle_failure(record: Record, failure: BaseException) -> None:
    """A settlement nobody waits for failed on its own (its keys in a bad state): said."""
    logger.error("billing settle failed for request %s", record["event_id"], exc_info=failure)


class RedisMeter:
    def __init__(
        self,
        settings: BillingSettings,
        *,
        book: PriceBook | None = None,
    ) -> None:
        self.settings = settings
        self.book = book or pricebook_from_path(settings.pricebook_path)
        self.keys = Keyspace(settings.billing_shards, settings.usage_stream)
        #: A general client on the same Redis, for what is not on the request path.
        self.redis: AsyncClient = async_client(
            settings.redis_url, timeout_s=settings.redis_timeout_s
        )
        target = parse_redis_url(settings.redis_url)
        scripts = [
            ADMIT_SCRIPT,
            SETTLE_SCRIPT,
            RENEW_SCRIPT,
            LEASE_SCRIPT,
            RETURN_LEASE_SCRIPT,
        ]
        self._cluster: ClusterScripts | None = None
        self._scripts: ScriptBatcher | ClusterScripts
        if target.cluster:
            self._scripts = self._cluster = ClusterScripts(
                target, scripts, timeout_s=settings.redis_timeout_s
            )
        else:
            self._scripts = ScriptBatcher(
                RespConnection(settings.redis_url, timeout_s=settings.redis_timeout_s), scripts
            )
        #: Where settled usage goes: Redis, or the disk spool when Redis does not take it.
        self.usage = UsageWriter(
            self._scripts,
            self.keys,
            UsageSpool(settings.usage_spool_dir),
            self.redis,
            answered=self._answered,
        )
        self._settlements = SettlementQueue(
            self.usage.write,
            window_s=settings.settle_batch_window_ms / 1000,
            unawaited=_log_settle_failure,
        )
        #: ``metrics.usage_events`` by (tier, outcome), bound once: ``labels()`` costs a
        #: lock and a lookup, per settlement.
        self._usage_events: dict[tuple[str, str], Any] = {}
        self._answer_charges = AnswerCharges()
        #: The spool replay started by ``settle_nowait`` (its one reference).
        self._replaying: asyncio.Task[int] | None = None
        #: The billing period admission names its budget keys by: Redis's clock's month,
        #: as last seen (the gateway's own until then).
        self._period = period_of(datetime.now(UTC))
        self.reservations = ReservationKeeper(self._renew, settings.reservation_ttl_s)
        self.local_allowance = LocalAllowance(
            settings.redis_down_allowance_nano_usd, settings.redis_down_allowance_requests
        )
        #: Shards found unreachable in this outage (on a single Redis, the one shard ""):
        #: a cluster's failover takes some shards away while the others answer, and the
        #: outage (and its allowance) ends only when every one has answered again.
        self._down_shards: set[str] = set()
        #: Busy keys' requests, admitted here on leases (``billing.meter.leases``).
        self.leases = Leases(
            self._scripts,
            self.keys,
            self.book,
            self.reservations,
            period=lambda: self._period,
            max_requests=settings.admission_lease_requests,
            lifetime_s=settings.admission_lease_lifetime_ms / 1000,
            reservation_ttl_s=settings.reservation_ttl_s,
        )
        self._publish_prices()

    def _publish_prices(self) -> None:
        version = self.book.version_at(datetime.now(UTC))
        for tier in TIERS:
            prices = version.tiers[tier]
            metrics.price_nano_usd_per_token.labels(tier, "input").set(prices.input)
            metrics.price_nano_usd_per_token.labels(tier, "output").set(prices.output)

    # -- admission -----------------------------------------------------------------

    def admit_ready(self, request: AdmissionRequest) -> Admission | None:
        """The request admitted on its key's lease (``billing.meter.leases``), or None."""
        worst = 0

        def units() -> int | None:
            # Its worst case's list cost: never less than the budget units it can add (a
            # promotion's multiplier is at least 1). Unpriceable: no lease admits it.
            nonlocal worst
            try:
                worst = worst_list_cost(
                    self.book,
                    tier=request.tier,
                    prompt_tokens=request.prompt_tokens,
                    max_output_tokens=request.max_output_tokens,
                    at=datetime.now(UTC),
                )
            except (PriceBookError, KeyError):
                return None
            return worst

        lease = self.leases.take(request, units)
        if lease is None:
            return None
        return Admission(
            request=request,
            headers=lease.headers(),
            reserved_nano_usd=worst,
            reservation_id=lease.reservation_id,
            headroom=headroom(
                lease.left_requests + lease.requests,
                lease.left_tokens + lease.tokens,
                lease.left_budget + lease.units,
                request.prompt_tokens + request.max_output_tokens,
                worst,
            ),
            lease=lease,
        )

    async def admit(self, request: AdmissionRequest) -> Admission:
        started = time.perf_counter()
        try:
            return await self._admit(request)
        except AdmissionRefused as refusal:
            metrics.admission_refusals.labels(request.tier, refusal.code).inc()
            raise
        finally:
            metrics.admission_seconds.observe(time.perf_counter() - started)

    async def _admit(self, request: AdmissionRequest) -> Admission:
        try:
            plan = self.book.plan(request.plan)
        except PriceBookError as exc:
            raise AdmissionRefused(str(exc), code="insufficient_quota") from None
        worst = worst_case_charge(
            self.book,
            tier=request.tier,
            model=request.model,
            prompt_tokens=request.prompt_tokens,
            max_output_tokens=request.max_output_tokens,
            at=datetime.now(UTC),
        )
        tokens = request.prompt_tokens + request.max_output_tokens
        try:
            gave_back = False
            for _ in range(3):
                reply = await self._scripts.call(
                    ADMIT_SCRIPT,
                    self.keys.admission_keys(
                        request.org_id, request.key_id, request.customer_id, self._period
                    ),
                    [
                        plan.rpm,
                        plan.tpm,
                        tokens,
                        worst.list_cost_nano,
                        plan.period_cap_nano,
                        request.request_id,
                        self.settings.reservation_ttl_s,
                        self._period,
                        worst.usage_multiplier.numerator,
                        worst.usage_multiplier.denominator,
                        plan.included_nano,
                    ],
                )
                if reply[0] == b"period":  # again, in Redis's period: the clocks' months differ
                    self._period = reply[5].decode()
                elif reply[0] in (b"quota", b"rate") and not gave_back:
                    # Again once this process's leases have given back what they hold of the
                    # key's limits and the org's budget: the request may fit in that.
                    gave_back = True
                    if not await self.leases.give_back(request, budget=reply[0] == b"quota"):
                        break
                else:
                    break
            if reply[0] == b"period":  # the month turned between calls: no admission unchecked
                raise billing_unavailable()
        except (*REDIS_DOWN, *SLOT_MOVING) as exc:
            return self._admit_without_redis(request, worst.list_cost_nano, exc)
        except redis_errors.ResponseError as exc:  # Redis refusing writes (OOM, READONLY)
            logger.warning("refused %s: Redis refused admission (%s)", request.request_id, exc)
            raise billing_unavailable() from exc
        self._answered(request.org_id)
        status = reply[0].decode() if isinstance(reply[0], bytes) else str(reply[0])
        if status != "ok":  # no lease is granted until an admission says there is room
            self.leases.admitted(request, left_requests=0, left_tokens=0, left_budget=0)
        headers = admission_headers(reply, rpm=plan.rpm, tpm=plan.tpm)
        if status == "suspended":
            raise AdmissionRefused(
                "this organization is suspended for an unpaid invoice; update the payment "
                "method to resume",
                code="insufficient_quota",
                headers=headers,
            )
        if status == "too_large":
            raise AdmissionRefused(
                f"this request needs up to {tokens} tokens (its prompts plus max_tokens for "
                f"every prompt and choice), more than the key's limit of {plan.tpm} tokens "
                "per minute; lower max_tokens or n, or send fewer prompts",
                code="rate_limit_exceeded",
                headers=headers,
            )
        if status == "rate":
            retry_after = max(1, -(-int(reply[5]) // 1_000_000))
            headers["retry-after"] = str(retry_after)
            raise AdmissionRefused(
                f"rate limit reached for this key ({plan.rpm} requests and {plan.tpm} tokens "
                f"per minute); retry after {retry_after}s",
                code="rate_limit_exceeded",
                retry_after_s=retry_after,
                headers=headers,
            )
        if status == "quota":
            raise AdmissionRefused(
                "this organization has used its plan's allowance and overage budget for "
                "the current billing period",
                code="insufficient_quota",
                headers=headers,
            )
        period = reply[5].decode() if isinstance(reply[5], bytes) else str(reply[5])
        reservation_id = f"{period}/{request.request_id}"
        self.reservations.hold(
            reservation_id,
            f"{self.keys.budget_prefix(request.org_id)}{period}:resv",
            request.request_id,
            request.max_duration_s,
        )
        reserved = int(reply[7])
        left_requests, left_tokens, left_budget = int(reply[1]), int(reply[3]), int(reply[6])
        self.leases.admitted(
            request, left_requests=left_requests, left_tokens=left_tokens, left_budget=left_budget
        )
        return Admission(
            request=request,
            headers=headers,
            reserved_nano_usd=reserved,
            reservation_id=reservation_id,
            headroom=headroom(left_requests, left_tokens, left_budget, tokens, reserved),
        )

    def _shard(self, org_id: str) -> str:
        return self.keys.tag(org_id) if self._cluster is not None else ""

    def _answered(self, org_id: str) -> None:
        """Redis answered for ``org_id``'s shard: the outage ends once none is down."""
        if self._down_shards:
            self._down_shards.discard(self._shard(org_id))
        if not self._down_shards:
            self.local_allowance.redis_answered()

    def _admit_without_redis(
        self, request: AdmissionRequest, worst_nano: int, exc: BaseException
    ) -> Admission:
        """Redis did not answer: refuse, or admit on this process's outage allowance."""
        if self.settings.admission_when_redis_down == "local_allowance" and unreachable(exc):
            self._down_shards.add(self._shard(request.org_id))
            if self.local_allowance.take(request.request_id, worst_nano):
                return Admission(request=request, reserved_nano_usd=worst_nano)
        else:
            logger.warning("refused %s: Redis did not answer (%s)", request.request_id, exc)
        raise billing_unavailable() from exc

    # -- settlement ----------------------------------------------------------------

    async def settle(self, admission: Admission, usage: UsageReport) -> None:
        """Count the actual usage and emit its event; spool it if Redis is unreachable."""
        await self._settlements.submit(self._record(admission, usage))  # raises only its own
        if self.usage.spool_scan_due():
            await self.usage.replay_spool()

    def settle_nowait(self, admission: Admission, usage: UsageReport) -> None:
        """``settle``, handed over without waiting: it goes (or is spooled) with the
        settlements of the moment, and its failure is logged. Its reservation is no longer
        renewed from now; it is priced when its batch goes."""
        if admission.reservation_id:
            self._let_go(admission)
            self._settlements.submit_nowait(functools.partial(self._priced_later, admission, usage))
        else:  # admitted on the outage allowance: what it did not use is given back now
            self._settlements.submit_nowait(self._record(admission, usage))
        if self.usage.spool_scan_due() and (self._replaying is None or self._replaying.done()):
            self._replaying = asyncio.get_running_loop().create_task(self.usage.replay_spool())

    def _record(self, admission: Admission, usage: UsageReport) -> Record:
        """The usage priced into what a settlement sends, its reservation released (or its
        part of the outage allowance given back)."""
        if admission.reservation_id:
            self._let_go(admission)
        record = self._priced(admission, usage)
        if not admission.reservation_id:
            self.local_allowance.settle(usage.request_id, record["list_nano_usd"])
        return record

    def _let_go(self, admission: Admission) -> None:
        """The request's reservation is no longer renewed for it (a lease's, once the
        lease is given back and none of its requests runs)."""
        if isinstance(admission.lease, Lease):
            self.leases.settled(admission.lease)
        elif admission.reservation_id:
            self.reservations.release(admission.reservation_id)

    def _priced_later(self, admission: Admission, usage: UsageReport) -> Record | None:
        try:
            return self._priced(admission, usage)
        except Exception:  # a usage report that cannot be priced: said, not sent
            logger.exception("billing settle failed for request %s", usage.request_id)
            return None

    def _priced(self, admission: Admission, usage: UsageReport) -> Record:
        """What a settlement sends (and what the spool keeps if Redis is down): the usage
        priced, its event serialised once."""
        event = usage_event_fields(self.book, admission, usage, self._answer_charges.take(usage))
        reservation = usage.request_id
        if admission.reservation_id:
            period, reservation = admission.reservation_id.split("/", 1)
        else:
            period = period_of(event["started_at"])
        counted = self._usage_events.get((usage.tier, usage.outcome))
        if counted is None:
            counted = self._usage_events[usage.tier, usage.outcome] = metrics.usage_events.labels(
                usage.tier, usage.outcome
            )
        counted.inc()
        multiplier = event["promotion_multiplier"]
        record: Record = {
            "org_id": usage.org_id,
            "period": period,
            "event_id": usage.request_id,
            # What the settle script adds to the budget (billing.allowance.budget_units).
            "list_nano_usd": event["list_cost_nano_usd"],
            "multiplier": multiplier,
            "included_nano_usd": self.book.included_nano(admission.request.plan),
            "event": usage_event_json(event),
        }
        if isinstance(admission.lease, Lease):  # the lease's reservation, its part of it
            record["reservation"] = reservation
            record["part"] = admission.reserved_nano_usd
        return record

    def usage_cost(self, usage: UsageReport) -> dict[str, Any] | None:
        try:
            priced = usage_charge(self.book, usage)
        except Exception:  # an answer goes out without its cost rather than not at all
            logger.exception("cannot price the answer of request %s", usage.request_id)
            return None
        self._answer_charges.remember(usage, priced)
        return answer_cost(self.book, usage, priced)

    async def _renew(self, keys: list[str], args: list[str]) -> int:
        """Push the reservations' expiries (``args``: the TTL, then a member per key). On
        a cluster, one call per slot, all of them even if one shard is down (whose
        failure is raised after the others are renewed)."""
        if self._cluster is None:
            return int(await self._scripts.call(RENEW_SCRIPT, keys, args))
        groups = list(self._cluster.group(keys).values())
        renewed = await asyncio.gather(
            *(
                self._scripts.call(
                    RENEW_SCRIPT, [keys[i] for i in group], [args[0], *(args[1 + i] for i in group)]
                )
                for group in groups
            ),
            return_exceptions=True,
        )
        total = 0
        for outcome in renewed:
            if isinstance(outcome, BaseException):
                raise outcome
            total += int(outcome)
        return total

    async def aclose(self) -> None:
        """Give back the leases, settle (or spool) what is gathered, replay the spool, then
        close."""
        await self.leases.aclose()
        await self._settlements.aclose()
        await self.reservations.aclose()
        try:
            await self.usage.replay_spool()
        finally:
            await self._scripts.aclose()
            # redis>=5 has aclose(); the bundled types-redis stubs predate it.
            await cast(Any, self.redis).aclose()
