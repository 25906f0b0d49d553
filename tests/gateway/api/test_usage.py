"""GET /v1/usage through billing's real ledger reader, which only reads: before the ledger
is migrated (or while its schema is older than the release) the gateway answers a clear
503, afterwards the org's usage."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest
from sqlalchemy import text

from billing.ledger import make_engine, migrate
from billing.ledger.usage_reader import LedgerUsageReader
from billing.settings import DEFAULT_PRICEBOOK_PATH
from tests.support.gateway import GatewayServer, create_key


def test_usage_is_a_503_until_the_ledger_is_migrated(
    start_gateway: Callable[..., GatewayServer],
    redis_url: str,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    ledger_url = f"sqlite:///{tmp_path / 'ledger.db'}"
    gateway = start_gateway(usage=LedgerUsageReader(ledger_url, DEFAULT_PRICEBOOK_PATH))
    key, _ = create_key(redis_url, "usage-org")
    headers = {"authorization": f"Bearer {key}"}

    early = httpx.get(f"{gateway.url}/v1/usage", headers=headers, timeout=30)
    assert early.status_code == 503, early.text
    error = early.json()["error"]
    assert (error["type"], error["code"]) == ("server_error", "usage_unavailable")
    # The operator's reason (it names a command) stays in the log, not in the answer.
    assert "cstack" not in error["message"] and "retry" in error["message"]

    assert "cstack billing migrate" in caplog.text

    engine = make_engine(ledger_url)
    migrate(engine, "0003")  # a release behind: the schema the gateway reads is not there
    with engine.begin() as connection:  # usage the previous release wrote
        connection.execute(
            text(
                "INSERT INTO usage_events (event_id, org_id, key_id, plan, model, tier, "
                "prompt_tokens, cached_tokens, completion_tokens, list_cost_nano_usd, "
                "allowance_consumed_nano_usd, promotion_multiplier, price_version, started_at, "
                "ended_at, outcome, recorded_at) VALUES ('old-1', 'usage-org', 'k', 'pro', "
                "'composer-2.5', 'fast', 10, 0, 5, 105000, 105000, '1', '2026-11-01', :now, "
                ":now, 'complete', :now)"
            ),
            {"now": datetime.now(UTC).replace(tzinfo=None)},
        )
    caplog.clear()
    stale = httpx.get(f"{gateway.url}/v1/usage", headers=headers, timeout=30)
    assert stale.status_code == 503, stale.text
    assert "older than this release" in caplog.text
    migrate(engine)
    engine.dispose()
    usage = httpx.get(f"{gateway.url}/v1/usage", headers=headers, timeout=30)
    assert usage.status_code == 200, usage.text
    assert usage.json()["org_id"] == "usage-org" and usage.json()["metered"] is True
    # The previous release's row, migrated: its allowance cost under its new name.
    assert usage.json()["totals"]["allowance_used_nano_usd"] == 105_000
