"""`cstack billing reconcile --all` against the Stripe stand-in, on SQLite and PostgreSQL:
every org of a month, orgs without a customer listed apart, each customer's upcoming
invoice explained (items not from the ledger listed apart); and the real billing worker
running it as its daily task, exporting the difference as metrics (no org in a label)."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from pydantic import SecretStr
from typer.testing import CliRunner

from billing.cli import billing_app
from billing.ledger import make_engine, migrate
from billing.ledger.writes import insert_usage_events
from billing.prices.pricing import load_pricebook
from billing.settings import BillingSettings
from billing.stripe.api import service_period, stripe_client
from billing.stripe.sync import sync_stripe
from billing.worker import make_celery, reconcile_periods
from serving.process import free_port
from tests.support.billing import Process, set_customers, write_test_book
from tests.support.builders import hand_event
from tests.support.fakes.stripe import StripeStandIn
from tests.support.waits import wait_until

DECEMBER = datetime(2026, 12, 1, 2, 0, tzinfo=UTC)
PLANS = {"none-included": {"included_usd": "0", "overage": "billed",
                           "overage_budget_usd": "100", "rpm": 10, "tpm": 10**6}}  # fmt: skip
VERSIONS = [
    {
        "version": "2026-11",
        "effective_from": "2026-11-01T00:00:00Z",
        "tiers": {
            "standard": {"input_per_1m": "0.50", "output_per_1m": "2.50"},
            "fast": {"input_per_1m": "3.00", "output_per_1m": "15.00"},
        },
    }
]


def fast_output(org: str, tokens: int) -> object:
    """``tokens`` output tokens on the fast tier: tokens x 15,000 nano-USD."""
    return hand_event(org, uuid.uuid4().hex[:8], datetime(2026, 11, 9, tzinfo=UTC), tier="fast",
                      version="2026-11", prompt=0, completion=tokens,
                      list_cost=tokens * 15000, plan="none-included")  # fmt: skip


@pytest.fixture
def month(
    ledger_url: str,
    billing_settings: BillingSettings,
    stripe_server: Callable[..., StripeStandIn],
    tmp_path: Path,
) -> tuple[BillingSettings, dict[str, str]]:
    """November: org a agrees with Stripe, org b is 7c off, org c has no customer; cus_A
    has a setup fee pending that the ledger does not know. (settings, org ids)"""
    server = stripe_server()
    book_path = write_test_book(tmp_path / "b.yaml", versions=VERSIONS, plans=PLANS)
    settings = billing_settings.model_copy(
        update={
            "ledger_url": ledger_url,
            "pricebook_path": book_path,
            "stripe_api_base": server.base_url,
            "stripe_api_key": SecretStr("sk_test_all"),
        }
    )
    run = uuid.uuid4().hex[:6]
    orgs = {name: f"org-{name}-{run}" for name in ("a", "b", "c")}
    engine = make_engine(ledger_url)
    migrate(engine)
    set_customers(engine, {orgs["a"]: f"cus_A{run}", orgs["b"]: f"cus_B{run}"})
    with engine.begin() as connection:
        insert_usage_events(
            connection,
            [
                fast_output(orgs["a"], 2_000),  # 3c
                fast_output(orgs["b"], 4_000),  # 6c
                fast_output(orgs["c"], 10_000),  # 15c, and no customer to bill
            ],  # type: ignore[list-item]
        )
    sync_stripe(engine, load_pricebook(book_path), settings, DECEMBER)
    client = stripe_client(settings)
    # Someone edits org b's item in Stripe's dashboard; and adds a fee for cus_A.
    (item,) = client.v1.invoice_items.list({"customer": f"cus_B{run}"}).data
    client.v1.invoice_items.update(item.id, params={"amount": 13})
    november = service_period(datetime(2026, 11, 1, tzinfo=UTC), datetime(2026, 12, 1, tzinfo=UTC))
    fee = {"customer": f"cus_A{run}", "amount": 500, "description": "setup fee", "period": november}
    client.v1.invoice_items.create(params=fee)  # type: ignore[arg-type]
    return settings, orgs


def env_of(settings: BillingSettings) -> dict[str, str]:
    assert settings.stripe_api_key is not None
    return {
        "CSTACK_LEDGER_URL": settings.ledger_url,
        "CSTACK_PRICEBOOK_PATH": str(settings.pricebook_path),
        "CSTACK_STRIPE_API_BASE": settings.stripe_api_base,
        "CSTACK_STRIPE_API_KEY": settings.stripe_api_key.get_secret_value(),
    }


def test_every_org_and_every_upcoming_invoice(
    month: tuple[BillingSettings, dict[str, str]],
) -> None:
    settings, orgs = month
    result = CliRunner().invoke(
        billing_app, ["reconcile", "--all", "--period", "2026-11"], env=env_of(settings)
    )
    assert result.exit_code == 1, result.output
    out = result.stdout
    run = orgs["a"].rsplit("-", 1)[1]
    assert f"  {orgs['a']}: ledger $0.03, Stripe $0.03 (cus_A{run}): agree" in out
    assert f"  {orgs['b']}: ledger $0.06, Stripe $0.13 (cus_B{run}): differ by +$0.07" in out
    assert "differ: fast.output.2026-11 (+$0.07)" in out
    assert f"no Stripe customer: {orgs['c']} ($0.15 not invoiced;" in out
    # cus_A's upcoming invoice: 3c from the ledger and the 5.00 fee, listed apart.
    assert (
        f"upcoming invoice of cus_A{run}: Stripe $5.03, from the ledger $0.03, "
        "not from the ledger $5.00"
    ) in out
    assert "not from the ledger: ii_" in out and "setup fee (+$5.00)" in out
    # cus_B's item is Stripe's 13c against the ledger's 6c: unexplained by the ledger.
    assert f"upcoming invoice of cus_B{run}: Stripe $0.13, from the ledger $0.06" in out
    assert "unexplained +$0.07" in out
    assert out.strip().splitlines()[-1] == (
        "2 org(s) compared, 1 differ (in all $0.07), 1 without a Stripe customer"
    )
    both = CliRunner().invoke(
        billing_app,
        ["reconcile", "--all", "--org", orgs["a"], "--period", "2026-11"],
        env=env_of(settings),
    )
    assert both.exit_code == 2
    assert both.stderr.strip() == "error: give --org ORG or --all (not both)"


def test_the_daily_run_in_the_real_worker_exports_the_difference(
    month: tuple[BillingSettings, dict[str, str]],
    billing_processes: Callable[..., Process],
) -> None:
    settings, orgs = month
    port = free_port()
    worker = billing_processes(
        ["worker", "billing"], settings.model_copy(update={"metrics_port": port})
    )
    make_celery(settings).send_task("billing.reconcile_all", args=[["2026-11"]])

    def exported() -> dict[str, float]:
        try:
            text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
        except httpx.HTTPError:
            return {}
        samples = {
            sample.name: sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
            if sample.name.startswith("cstack_billing_reconcile_")
        }
        return samples if samples.get("cstack_billing_reconcile_last_run_timestamp_seconds") else {}

    samples = wait_until(exported, "the daily reconcile's metrics", 120)
    assert samples["cstack_billing_reconcile_orgs_differing"] == 1
    assert samples["cstack_billing_reconcile_difference_nano_usd"] == 7 * 10_000_000
    assert samples["cstack_billing_reconcile_upcoming_difference_nano_usd"] == 7 * 10_000_000
    log = worker.log.read_text()
    assert f"{orgs['b']} differs from Stripe by +$0.07" in log
    assert f"{orgs['c']} has no Stripe customer ($0.15 not invoiced)" in log


def test_beat_runs_it_daily_for_the_last_month() -> None:
    settings = BillingSettings()
    schedule = make_celery(settings).conf.beat_schedule["reconcile-all"]
    assert schedule["task"] == "billing.reconcile_all"
    assert schedule["schedule"].hour == {settings.reconcile_hour_utc}
    assert reconcile_periods(datetime(2027, 1, 3, 3, tzinfo=UTC), settings) == ["2026-12"]
    eager = settings.model_copy(update={"stripe_post_open_periods": True})
    assert reconcile_periods(datetime(2027, 3, 1, 3, tzinfo=UTC), eager) == ["2027-02", "2027-03"]
