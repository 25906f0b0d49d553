"""The launch week through `cstack up` (embedded Valkey, the gateway, the billing worker and
beat, in front of the session's vLLM) with the Stripe stand-in: mixed traffic from the
openai SDK crosses an org's allowance during the promotion; the stack's own worker
writes the ledger and posts to Stripe; the invoice, the receipts and Stripe's items are
the hand computation from the published rule (tests/billing/launch_traffic.py), and
`cstack billing reconcile --all` agrees."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import stripe
import yaml
from openai import AsyncOpenAI

from serving.process import free_port
from tests.support.commands import cstack_command
from tests.support.launch_traffic import hand_invoice, mixed_traffic

pytestmark = pytest.mark.vllm

STAND_IN = [sys.executable, "-m", "tests.support.fakes.stripe.server"]
INCLUDED = 5_000_000  # $0.005
VERSION = "2026-11-01"


def price_book(path: Path) -> Path:
    """The launch prices, a plan with $0.005 included, and a launch week around now."""
    now = datetime.now(UTC)
    book = {
        "versions": [{"version": VERSION, "effective_from": "2026-11-01T00:00:00Z",
                      "tiers": {"standard": {"input_per_1m": "0.50", "output_per_1m": "2.50"},
                                "fast": {"input_per_1m": "3.00", "output_per_1m": "15.00"}}}],
        # "default": the plan of the org `cstack up` makes its own first completions with.
        "plans": {"launch": {"included_usd": "0.005", "overage": "billed",
                             "overage_budget_usd": "1.00", "rpm": 100000, "tpm": 100000000},
                  "default": {"included_usd": "10.00", "overage": "refused", "rpm": 600,
                              "tpm": 1000000}},
        "promotions": [{"id": "launch-week", "starts_at": (now - timedelta(days=1)).isoformat(),
                        "days": 7, "models": ["composer-2.5*"], "usage_multiplier": "2"}],
    }  # fmt: skip
    path.write_text(yaml.safe_dump(book))
    return path


def read_until_ready(proc: subprocess.Popen[str], timeout_s: float) -> str:
    """The base URL `cstack up` prints once everything is healthy."""
    assert proc.stdout is not None
    lines: list[str] = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line and proc.poll() is not None:
            break
        lines.append(line.rstrip("\n"))
        if line.startswith("ready: "):
            return line.split(": ", 1)[1].strip()
    pytest.fail("cstack up never became ready; output:\n" + "\n".join(lines))


def cstack(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        cstack_command(*args), env=env, capture_output=True, text=True, timeout=120, check=False
    )


def wait_for(what: str, timeout_s: float, check: Any) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.5)
    pytest.fail(f"timed out after {timeout_s}s waiting for {what}")


def test_up_bills_the_launch_week_as_published(vllm_url: str, tmp_path: Path) -> None:
    state = tmp_path / "state"
    stripe_port = free_port()
    stand_in = subprocess.Popen(
        [*STAND_IN, f"--port={stripe_port}",
         f"--record={tmp_path / 'stripe.jsonl'}"]
    )  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k != "CSTACK_REDIS_URL"}
    env |= {
        "CSTACK_VLLM_URL": vllm_url,
        "CSTACK_STATE_DIR": str(state),
        "CSTACK_GATEWAY_PORT": str(free_port()),
        "CSTACK_PRICEBOOK_PATH": str(price_book(tmp_path / "book.yaml")),
        "CSTACK_STRIPE_API_BASE": f"http://127.0.0.1:{stripe_port}",
        "CSTACK_STRIPE_API_KEY": "sk_test_up",
        "CSTACK_STRIPE_POST_OPEN_PERIODS": "true",
        "CSTACK_STRIPE_SYNC_INTERVAL_S": "1",
    }
    ledger = {"CSTACK_LEDGER_URL": f"sqlite:///{(state / 'ledger.db').resolve()}"}
    proc = subprocess.Popen(
        cstack_command("up"), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        base_url = read_until_ready(proc, timeout_s=600)
        org = f"org-up-{os.getpid()}"
        created = cstack(env, "keys", "create", "--org", org, "--plan", "launch")
        assert created.returncode == 0, created.stderr
        token = dict(line.split(": ", 1) for line in created.stdout.splitlines())["key"]
        customer = cstack(env | ledger, "keys", "customer", org, "cus_UpLaunch")
        assert customer.returncode == 0, customer.stderr

        client = AsyncOpenAI(base_url=base_url, api_key=token, max_retries=0, timeout=300)
        requests = asyncio.run(mixed_traffic(client, INCLUDED))
        hand = hand_invoice(requests, INCLUDED, VERSION)
        assert hand.allowance == INCLUDED and hand.overage > 0  # crossed
        assert hand.total_cents > 0  # an invoice in whole cents, not fractions of one

        # The stack's own worker writes the ledger; then every receipt is there.
        api = httpx.Client(headers={"authorization": f"Bearer {token}"}, timeout=60)

        def receipts() -> list[dict[str, Any]]:
            listed = api.get(f"{base_url}/usage/requests", params={"limit": 1000}).json()
            return list(listed["data"]) if len(listed["data"]) == len(requests) else []

        shown = wait_for("every receipt", 120, receipts)
        assert sum(r["allowance_consumed_nano_usd"] for r in shown) == hand.allowance
        assert sum(r["promotion_credit_nano_usd"] for r in shown) == hand.covered - hand.allowance
        assert sum(r["overage_nano_usd"] for r in shown) == hand.overage
        api.close()

        # ... and posts the running month to Stripe: the hand computation, to the cent.
        client_api = stripe.StripeClient(
            "sk_test_up", base_addresses={"api": env["CSTACK_STRIPE_API_BASE"]},
            max_network_retries=0,
        )  # fmt: skip

        def posted() -> dict[str, int]:
            items = client_api.v1.invoice_items.list({"customer": "cus_UpLaunch", "limit": 100})
            lines = {i.metadata["cstack_line"]: i.amount for i in items.data if i.amount}
            return lines if lines and sum(lines.values()) == hand.total_cents else {}

        lines = wait_for("Stripe to hold the invoice", 120, posted)
        assert set(lines) <= set(hand.lines)
        period = datetime.now(UTC).strftime("%Y-%m")
        agreed = cstack(env | ledger, "billing", "reconcile", "--all", "--period", period)
        assert agreed.returncode == 0, agreed.stdout + agreed.stderr
        assert agreed.stdout.strip().splitlines()[-1].endswith(": agree")
        preview = cstack(env | ledger, "billing", "invoice-preview", "--org", org)
        total = [line for line in preview.stdout.splitlines() if "Total due" in line]
        dollars, cents = divmod(hand.total_cents, 100)
        assert total and total[0].endswith(f"${dollars}.{cents:02d}"), preview.stdout
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=120)
        stand_in.terminate()
        stand_in.wait(timeout=10)
    assert "stopped" in out
