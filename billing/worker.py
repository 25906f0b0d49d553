"""The billing Celery app: beat asks, the worker drains the usage stream, syncs Stripe and
reconciles every org with Stripe once a day.

Beat enqueues short, expiring tasks on a fixed cadence; any number of workers may run them
concurrently (the consumer group splits the stream, a Redis lock serialises Stripe sync).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from datetime import UTC, datetime, timedelta
from functools import cache
from typing import Any

from celery import Celery
from celery.schedules import crontab
from redis.exceptions import LockError
from redis.lock import Lock
from sqlalchemy import Engine

from billing.ledger import make_engine, migrate
from billing.ledger.consumer import UsageStreamConsumer
from billing.meter.keyspace import Keyspace
from billing.prices.periods import period_bounds, period_of
from billing.prices.pricing import pricebook_from_path
from billing.redis.client import REDIS_FAILURES, SyncClient, parse_redis_url, sync_client
from billing.settings import BillingSettings
from billing.stripe.api import stripe_client
from billing.stripe.reconcile_all import export, reconcile_all
from billing.stripe.sync import sync_stripe
from billing.stripe.webhooks import restore_suspensions

logger = logging.getLogger(__name__)

QUEUE = "billing"
STRIPE_LOCK = "cstack:billing:stripe-sync-lock"


def broker_url(settings: BillingSettings) -> str:
    """Celery's broker: ``celery_broker_url``, else the one Redis of ``redis_url``."""
    if settings.celery_broker_url:
        return settings.celery_broker_url
    if parse_redis_url(settings.redis_url).cluster:
        raise ValueError(
            "CSTACK_REDIS_URL names a Redis Cluster, which Celery cannot use as its broker: "
            "set CSTACK_CELERY_BROKER_URL to a single Redis"
        )
    return settings.redis_url


def make_celery(settings: BillingSettings) -> Celery:
    app = Celery("cstack-billing", broker=broker_url(settings))
    drain_every = settings.ledger_drain_interval_s
    app.conf.update(
        task_default_queue=QUEUE,
        task_ignore_result=True,
        worker_prefetch_multiplier=1,
        broker_connection_retry_on_startup=True,
        timezone="UTC",
        beat_schedule_filename=str(settings.beat_schedule_file),
        beat_schedule={
            "drain-usage-stream": {
                "task": "billing.drain_usage_stream",
                "schedule": drain_every,
                # A backlog of drain requests is pointless: one drain empties the stream.
                "options": {"expires": max(5.0, 5 * drain_every)},
            },
            "restore-suspensions": {
                "task": "billing.restore_suspensions",
                "schedule": 60.0,
                "options": {"expires": 60.0},
            },
            "sync-stripe": {
                "task": "billing.sync_stripe",
                "schedule": settings.stripe_sync_interval_s,
                "options": {"expires": settings.stripe_sync_interval_s},
            },
            "reconcile-all": {
                "task": "billing.reconcile_all",
                "schedule": crontab(minute=0, hour=settings.reconcile_hour_utc),
                "options": {"expires": 3600.0},
            },
        },
    )
    return app


settings = BillingSettings()
celery_app = make_celery(settings)


@cache
def ledger() -> Engine:
    return make_engine(settings.ledger_url)


@cache
def redis() -> SyncClient:
    return sync_client(settings.redis_url)


def prepare(current: BillingSettings = settings) -> None:
    """Run before a worker starts: ledger schema at head, consumer groups present."""
    migrate(ledger())
    UsageStreamConsumer(redis(), ledger(), current).ensure_group()


@celery_app.task(name="billing.drain_usage_stream")
def drain_usage_stream() -> dict[str, Any]:
    consumer = UsageStreamConsumer(redis(), ledger(), settings)
    result = consumer.drain(max_seconds=max(5.0, 5 * settings.ledger_drain_interval_s))
    return asdict(result)


@celery_app.task(name="billing.restore_suspensions")
def restore_suspensions_task() -> dict[str, Any]:
    return {
        "suspended": restore_suspensions(
            ledger(), redis(), Keyspace(settings.billing_shards, settings.usage_stream)
        )
    }


@celery_app.task(name="billing.sync_stripe")
def sync_stripe_task() -> dict[str, Any]:
    if settings.stripe_api_key is None:
        logger.info("Stripe sync skipped: CSTACK_STRIPE_API_KEY is not set")
        return {"skipped": True}
    ttl_s = settings.stripe_sync_lock_ttl_s
    # Not thread-local: ``renewed`` renews it from a thread of its own.
    lock = redis().lock(STRIPE_LOCK, timeout=ttl_s, blocking=False, thread_local=False)
    if not lock.acquire():
        return {"skipped": True}
    try:
        with renewed(lock, ttl_s):
            book = pricebook_from_path(settings.pricebook_path)
            return asdict(sync_stripe(ledger(), book, settings, datetime.now(UTC)))
    finally:
        with contextlib.suppress(LockError):  # it expired while Redis was away
            lock.release()


@contextmanager
def renewed(lock: Lock, ttl_s: float) -> Iterator[None]:
    """Keep a held ``lock`` (made with ``thread_local=False``) while the block runs: its
    TTL is set to ``ttl_s`` again every third of it, by a thread, so a long sync keeps it
    and a dead worker's frees itself."""
    stop = threading.Event()

    def renew() -> None:
        while not stop.wait(ttl_s / 3):
            try:
                lock.reacquire()
            except LockError:  # lost: it expired while Redis was away
                logger.warning("the Stripe sync lost its lock; another sync may start")
                return
            except REDIS_FAILURES:
                continue  # Redis away for now: try again, before the TTL runs out

    thread = threading.Thread(target=renew, name="stripe-sync-lock", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def reconcile_periods(now: datetime, current: BillingSettings = settings) -> list[str]:
    """The months the daily reconcile checks: the last one posted (the previous month),
    and the running one where it is posted as it fills."""
    this_month = period_of(now)
    periods = [period_of(period_bounds(this_month)[0] - timedelta(days=1))]
    if current.stripe_post_open_periods:
        periods.append(this_month)
    return periods


@celery_app.task(name="billing.reconcile_all")
def reconcile_all_task(periods: list[str] | None = None) -> dict[str, Any]:
    """`cstack billing reconcile --all` for ``periods`` (beat's: ``reconcile_periods``), its
    totals exported as metrics (alerts BillingReconcileDifference, BillingReconcileStale)."""
    if settings.stripe_api_key is None:
        logger.info("daily reconcile skipped: CSTACK_STRIPE_API_KEY is not set")
        return {"skipped": True}
    now = datetime.now(UTC)
    book = pricebook_from_path(settings.pricebook_path)
    client = stripe_client(settings)
    checked = periods or reconcile_periods(now)
    results = [reconcile_all(ledger(), book, client, period) for period in checked]
    export(results, now)
    return {
        "periods": [result.period for result in results],
        "orgs": sum(len(result.orgs) for result in results),
        "differing": sum(len(result.differing) for result in results),
        "difference_cents": sum(result.difference_cents for result in results),
    }
