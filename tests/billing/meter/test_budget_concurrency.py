"""Two OS processes sharing one Redis race 200 requests at a tiny budget: the org must not
end the period more than one request's worst case over its limit."""

from __future__ import annotations

import json
from concurrent.futures import ProcessPoolExecutor
from datetime import datetime
from multiprocessing import get_context

import redis

from billing.prices.periods import period_of
from billing.prices.pricing import load_pricebook
from billing.settings import BillingSettings
from tests.support.billing import hammer_meter, keyspace, usage_entries


def test_200_concurrent_requests_from_two_processes_stay_within_budget(
    billing_settings: BillingSettings,
) -> None:
    org = "org-race"
    settings_json = billing_settings.model_dump_json()
    with ProcessPoolExecutor(max_workers=2, mp_context=get_context("spawn")) as pool:
        futures = [pool.submit(hammer_meter, settings_json, org, 100, seed) for seed in (1, 2)]
        results = [future.result(timeout=120) for future in futures]
    admitted = sum(a for a, _ in results)
    refused = sum(r for _, r in results)
    assert admitted + refused == 200
    assert admitted > 0 and refused > 0, "the budget must both admit and refuse"

    book = load_pricebook(billing_settings.pricebook_path)
    cap = book.plan("tiny").period_cap_nano
    worst = 100 * 3000 + 50 * 15000
    client = redis.Redis.from_url(billing_settings.redis_url)
    entries = usage_entries(client, billing_settings)
    events = [json.loads(fields[b"event"]) for _, fields in entries]
    periods = {e["started_at"][:7] for e in events}
    (period,) = periods
    state = {
        k.decode(): int(v)
        for k, v in client.hgetall(keyspace(billing_settings).budget_prefix(org) + period).items()
    }
    spent = sum(e["allowance_cost_nano_usd"] for e in events)

    assert len(events) == admitted  # one usage event per admitted request
    assert state == {"reserved": 0, "used": spent}
    assert spent <= cap + worst  # the bound
    # Admission reserves the whole worst case and actual usage never exceeds it here, so
    # the org does not even go over by one request.
    assert spent <= cap
    assert period == period_of(datetime.fromisoformat(events[0]["started_at"]))
