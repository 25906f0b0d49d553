"""Settings for the billing package (env prefix ``CSTACK_``).

Secrets (the Stripe API key and webhook secret) have no defaults: a deployment that
forgets them fails loudly at the point of use instead of talking to Stripe with a
placeholder.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, model_validator

from serving.settings import CstackSettings

DEFAULT_PRICEBOOK_PATH = Path(__file__).parent / "prices" / "pricebook.yaml"


class BillingSettings(CstackSettings):
    #: Redis for admission state and the usage streams: one Redis (``redis://``,
    #: ``rediss://``, ``unix://``) or a Redis Cluster (``redis-cluster://`` or
    #: ``rediss-cluster://`` and one or more of its nodes, comma-separated).
    #: The billing worker's Celery broker; empty: ``redis_url``. Celery cannot use a Redis
    #: Cluster, so a cluster deployment names a single Redis here.
    celery_broker_url: str = ""
    #: Shards of billing's keys (each with its usage stream): an org's keys are on one,
    #: all in one Redis Cluster hash slot. Fixed for a deployment's life: changing it
    #: moves orgs away from their budgets. More shards spread a cluster finer and make
    #: each slot quicker to migrate (its orgs are on the outage allowance meanwhile).
    billing_shards: int = Field(default=16, ge=1, le=1024)
    #: The versioned price book (prices, plans, promotions).
    pricebook_path: Path = DEFAULT_PRICEBOOK_PATH
    #: The ledger; a SQLite file by default, PostgreSQL in production.
    ledger_url: str = "sqlite:///.cstack/ledger.db"

    usage_stream: str = "cstack:usage"
    usage_dead_letter_stream: str = "cstack:usage:dead"
    usage_consumer_group: str = "billing-ledger"
    #: Where the gateway spools usage events while Redis is unreachable (one file a process).
    usage_spool_dir: Path = Path(".cstack/usage-spool")
    #: A reservation not renewed within this time is released (its gateway died). A live
    #: gateway renews its requests' reservations every third of it while they run.
    reservation_ttl_s: int = Field(default=900, ge=1)
    #: What admission does while Redis is unreachable (refused or dropped connections, or a
    #: connect timeout; on a Redis Cluster also a shard whose slot is being moved):
    #: ``fail_closed`` refuses every request with a 503; ``local_allowance`` lets each
    #: gateway admit up to the two budgets below per outage (an outage
    #: ends when Redis answers again), then refuses with a 503. Usage admitted meanwhile
    #: reaches the ledger through the disk spool either way. A Redis that accepted a command
    #: and then timed out always fails closed: the script may have run.
    admission_when_redis_down: Literal["fail_closed", "local_allowance"] = "local_allowance"
    #: Per gateway and outage: worst-case list cost of the requests in flight plus the
    #: actual list cost of those finished ($2 by default), and the number of requests
    #: admitted. A
    #: `cstack gateway --workers N` gives each worker process 1/N (gateway/server/workers.py).
    redis_down_allowance_nano_usd: int = Field(default=2_000_000_000, ge=0)
    redis_down_allowance_requests: int = Field(default=500, ge=0)
    #: Leases (meter/leases.py): a busy key far from its limits has its requests admitted
    #: in the gateway process against a slice of its rate limits and its org's budget
    #: taken from Redis, each grant for at most this many requests (0: off).
    admission_lease_requests: int = Field(default=64, ge=0, le=4096)
    #: How long a lease admits requests after the call that granted it was sent, before
    #: what is left is given back: also how late a suspension, or a budget spent by the
    #: org's other keys, may reach a busy key's requests (the budget itself is never
    #: overrun: it is reserved up front).
    admission_lease_lifetime_ms: int = Field(default=1000, ge=1, le=60_000)
    #: Connect/read timeout of Redis calls.
    redis_timeout_s: float = 2.0
    #: Settlements (after the response has gone) wait up to this long to be sent to Redis
    #: together, one script call for all (0: only those of the same moment go together).
    #: Longer windows spend less gateway CPU per request; the budget is still held by the
    #: request's reservation until its settlement lands.
    settle_batch_window_ms: float = Field(default=5.0, ge=0, le=1000)

    #: Ledger consumer: entries per read, idle time before another consumer reclaims an
    #: entry, and deliveries after which an entry is dead-lettered.
    ledger_batch_size: int = 500
    ledger_claim_idle_ms: int = 30_000
    ledger_max_deliveries: int = 5
    #: How often beat asks the worker to drain the stream and to sync Stripe.
    ledger_drain_interval_s: float = 1.0
    stripe_sync_interval_s: float = 60.0
    #: How long the lock that serialises Stripe syncs outlives a worker that dies holding
    #: it (killed, its node lost); a running sync renews it every third of this.
    stripe_sync_lock_ttl_s: float = Field(default=30.0, gt=0)
    stripe_retry_base_s: float = 30.0
    stripe_retry_max_s: float = 3600.0

    stripe_api_key: SecretStr | None = None
    stripe_api_base: str = "https://api.stripe.com"
    stripe_webhook_secret: SecretStr | None = None
    #: The largest webhook body read: anyone can POST to the endpoint, and the signature
    #: can only be checked once the body is in memory (Stripe's events are far smaller).
    stripe_webhook_max_bytes: int = Field(default=256 * 1024, ge=1024)

    # -- Stripe invoice items (billing/stripe/sync.py) ------------------------------------
    #: A month's invoice items are posted once the month has been over this long, so that
    #: usage still in flight at midnight is on them; later usage becomes another delta item.
    stripe_invoice_grace_s: int = 3600
    #: Also post the running month on every sync (development, staging, tests: Stripe's
    #: upcoming invoice follows usage). Production leaves it off: each sync that sees new
    #: usage adds a delta item per changed line, and an invoice should not carry hundreds.
    stripe_post_open_periods: bool = False

    #: The hour (UTC) of the worker's daily `cstack billing reconcile --all` of the last
    #: month (and of the running one where it is posted as it fills): after the customers'
    #: Stripe invoices are made (an anchor at 02:00 UTC on the 1st, after the grace).
    reconcile_hour_utc: int = Field(default=3, ge=0, le=23)

    #: Prometheus port of the billing worker / beat (none: no endpoint).
    metrics_port: int | None = None
    #: Where `cstack beat` keeps its schedule state.
    beat_schedule_file: Path = Path(".cstack/celerybeat-schedule")

    @model_validator(mode="after")
    def _leases_outlived_by_their_reservations(self) -> BillingSettings:
        # A lease's reservation is renewed a third of its TTL apart, from the first grant
        # on: a lease that outlived it could admit against money no longer held.
        if self.admission_lease_lifetime_ms >= self.reservation_ttl_s * 1000:
            raise ValueError(
                f"admission_lease_lifetime_ms ({self.admission_lease_lifetime_ms}) must be "
                f"shorter than reservation_ttl_s ({self.reservation_ttl_s} s)"
            )
        return self
