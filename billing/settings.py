"""Settings for the billing package (env prefix ``CSTACK_``).

Secrets (the Stripe API key and webhook secret) have no defaults: a deployment that
forgets them fails loudly at the point of use instead of talking to Stripe with a
placeholder.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

DEFAULT_PRICEBOOK_PATH = Path(__file__).with_name("pricebook.yaml")


class BillingSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="CSTACK_", extra="ignore")

    #: Redis for admission state, the usage stream and the Celery broker.
    redis_url: str = "redis://127.0.0.1:6379/0"
    #: The versioned price book (prices, plans, promotions).
    pricebook_path: Path = DEFAULT_PRICEBOOK_PATH
    #: The ledger; a SQLite file by default, PostgreSQL in production.
    ledger_url: str = "sqlite:///.cstack/ledger.db"

    usage_stream: str = "cstack:usage"
    usage_dead_letter_stream: str = "cstack:usage:dead"
    usage_consumer_group: str = "billing-ledger"
    #: Where the gateway spools usage events while Redis is unreachable (one file a process).
    usage_spool_dir: Path = Path(".cstack/usage-spool")
    #: A reservation not settled within this time is released (its gateway died).
    reservation_ttl_s: int = 900
    #: Admit without limits while Redis is unreachable: serving beats refusing, and the
    #: usage still reaches the ledger through the spool.
    admission_fail_open: bool = True
    #: Connect/read timeout; admission fails open only when Redis refuses connections,
    #: never on a timeout (a timed-out script may have run: failing open would double it).
    redis_timeout_s: float = 2.0
    #: Connections per process; callers beyond it wait for one instead of opening more,
    #: so a burst of requests cannot stampede Redis with connects.
    redis_max_connections: int = 64

    #: Ledger consumer: entries per read, idle time before another consumer reclaims an
    #: entry, and deliveries after which an entry is dead-lettered.
    ledger_batch_size: int = 500
    ledger_claim_idle_ms: int = 30_000
    ledger_max_deliveries: int = 5
    #: How often beat asks the worker to drain the stream and to sync Stripe.
    ledger_drain_interval_s: float = 1.0
    stripe_sync_interval_s: float = 60.0
    #: A minute is reported to Stripe once it is this old (late events get a new batch).
    stripe_minute_grace_s: int = 30
    stripe_retry_base_s: float = 30.0
    stripe_retry_max_s: float = 3600.0

    stripe_api_key: SecretStr | None = None
    stripe_api_base: str = "https://api.stripe.com"
    stripe_webhook_secret: SecretStr | None = None

    #: Prometheus port of the billing worker / beat (none: no endpoint).
    metrics_port: int | None = None
    #: Where `cstack beat` keeps its schedule state.
    beat_schedule_file: Path = Path(".cstack/celerybeat-schedule")
