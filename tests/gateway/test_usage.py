"""GET /v1/usage through billing's real ledger reader, which only reads: before the ledger
is migrated the gateway answers a clear 503, afterwards the org's usage."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from gateway_support import GatewayServer, create_key

from billing.ledger import make_engine, migrate
from billing.summary import LedgerUsageReader


def test_usage_is_a_503_until_the_ledger_is_migrated(
    start_gateway: Callable[..., GatewayServer],
    redis_url: str,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    ledger_url = f"sqlite:///{tmp_path / 'ledger.db'}"
    gateway = start_gateway(usage=LedgerUsageReader(ledger_url))
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
    migrate(engine)
    engine.dispose()
    usage = httpx.get(f"{gateway.url}/v1/usage", headers=headers, timeout=30)
    assert usage.status_code == 200, usage.text
    assert usage.json()["org_id"] == "usage-org" and usage.json()["metered"] is True
