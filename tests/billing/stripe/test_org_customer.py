"""The org owns its Stripe customer: set and changed through the admin API and `cstack keys`
(a real gateway with billing's real accounts, the session's Valkey, a SQLite or
PostgreSQL ledger), recorded where invoices go by and copied where admission reads it.
An org with usage and no customer is counted, and its month is posted once it has one,
to that customer."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest
from prometheus_client import REGISTRY
from pydantic import SecretStr
from sqlalchemy import Engine, select
from typer.testing import CliRunner

from billing.ledger import InvoiceChange, make_engine, migrate
from billing.ledger.reporting import UnmeteredUsageReader
from billing.ledger.writes import insert_usage_events
from billing.meter.protocol import UnmeteredMeter
from billing.prices.pricing import load_pricebook
from billing.settings import BillingSettings
from billing.stripe.api import list_invoice_items, stripe_client
from billing.stripe.customers import LedgerAccounts, org_customer
from billing.stripe.sync import sync_stripe
from deploy.cli import app as cli_app
from gateway.settings import GatewaySettings
from serving.process import free_port
from tests.support.billing import write_test_book
from tests.support.builders import hand_event
from tests.support.fakes.stripe import StripeStandIn
from tests.support.gateway import ADMIN_TOKEN, GatewayServer

ADMIN = {"authorization": f"Bearer {ADMIN_TOKEN}"}


@pytest.fixture
def ledger(ledger_url: str) -> Engine:
    engine = make_engine(ledger_url)
    migrate(engine)
    return engine


@pytest.fixture
def admin(redis_url: str, ledger_url: str, ledger: Engine) -> Iterator[str]:
    """A real gateway recording customers in the ledger; its internal (admin) URL."""
    settings = GatewaySettings(
        port=free_port(),
        internal_port=free_port(),
        redis_url=redis_url,
        admin_token=ADMIN_TOKEN,
        upstream_url="http://127.0.0.1:9",
    )
    server = GatewayServer(
        settings, UnmeteredMeter(), UnmeteredUsageReader(), accounts=LedgerAccounts(ledger_url)
    )
    server.start()
    yield server.internal_url
    server.stop()


def customer_of(ledger: Engine, org: str) -> str | None:
    with ledger.connect() as connection:
        return org_customer(connection, org)


def test_the_admin_api_sets_and_changes_an_orgs_customer(admin: str, ledger: Engine) -> None:
    org = f"org-cus-{uuid.uuid4().hex[:6]}"
    bad = httpx.post(
        f"{admin}/admin/orgs", json={"org_id": org, "customer_id": "acme"}, headers=ADMIN
    )
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "customer_id"
    created = httpx.post(
        f"{admin}/admin/orgs", json={"org_id": org, "customer_id": "cus_First"}, headers=ADMIN
    )
    assert created.status_code == 201 and created.json()["customer_id"] == "cus_First"
    assert customer_of(ledger, org) == "cus_First"

    changed = httpx.patch(
        f"{admin}/admin/orgs/{org}", json={"customer_id": "cus_Second"}, headers=ADMIN
    )
    assert changed.status_code == 200 and changed.json()["customer_id"] == "cus_Second"
    shown = httpx.get(f"{admin}/admin/orgs/{org}", headers=ADMIN).json()
    assert shown["customer_id"] == "cus_Second" == customer_of(ledger, org)

    removed = httpx.patch(f"{admin}/admin/orgs/{org}", json={"customer_id": ""}, headers=ADMIN)
    assert removed.status_code == 200 and removed.json()["customer_id"] == ""
    assert customer_of(ledger, org) is None
    unknown = httpx.patch(
        f"{admin}/admin/orgs/nobody-{org}", json={"customer_id": "cus_X"}, headers=ADMIN
    )
    assert unknown.status_code == 404
    malformed = httpx.patch(
        f"{admin}/admin/orgs/{org}", json={"customer_id": "cus_ bad"}, headers=ADMIN
    )
    assert malformed.status_code == 400 and customer_of(ledger, org) is None


def test_cstack_keys_sets_and_shows_an_orgs_customer(
    redis_url: str, ledger_url: str, ledger: Engine
) -> None:
    org = f"org-cli-{uuid.uuid4().hex[:6]}"
    env = {"CSTACK_REDIS_URL": redis_url, "CSTACK_LEDGER_URL": ledger_url}

    def cstack(*args: str) -> object:
        return CliRunner().invoke(cli_app, ["keys", *args], env=env)

    assert cstack("create", "--org", org).exit_code == 0  # type: ignore[attr-defined]
    assert "stripe customer: (none)" in cstack("org", org).stdout  # type: ignore[attr-defined]
    set_ = cstack("customer", org, "cus_Cli")
    assert set_.exit_code == 0, set_.output  # type: ignore[attr-defined]
    assert set_.stdout.strip() == f"org {org}: Stripe customer cus_Cli"  # type: ignore[attr-defined]
    assert customer_of(ledger, org) == "cus_Cli"
    assert "stripe customer: cus_Cli" in cstack("org", org).stdout  # type: ignore[attr-defined]
    for args, message in (
        (("customer", org, "nope"), "error: invalid Stripe customer id 'nope'"),
        (("customer", org), "error: give a Stripe customer id or --remove (not both)"),
        (("customer", f"{org}-x", "cus_Y"), f"error: unknown org '{org}-x'"),
    ):
        refused = cstack(*args)
        assert refused.exit_code == 1  # type: ignore[attr-defined]
        assert refused.stderr.strip().startswith(message), refused.stderr  # type: ignore[attr-defined]
    assert cstack("customer", org, "--remove").exit_code == 0  # type: ignore[attr-defined]
    assert customer_of(ledger, org) is None


def test_a_month_waits_for_its_orgs_customer_then_goes_to_it(
    billing_settings: BillingSettings,
    stripe_server: Callable[..., StripeStandIn],
    ledger_url: str,
    ledger: Engine,
    tmp_path: Path,
) -> None:
    server = stripe_server()
    org = f"org-wait-{uuid.uuid4().hex[:6]}"
    path = write_test_book(
        tmp_path / "book.yaml",
        versions=[
            {
                "version": "v1",
                "effective_from": "2026-11-01T00:00:00Z",
                "tiers": {
                    "standard": {"input_per_1m": "0.50", "output_per_1m": "2.50"},
                    "fast": {"input_per_1m": "3.00", "output_per_1m": "15.00"},
                },
            }
        ],
        plans={"hand": {"included_usd": "0", "overage": "billed", "overage_budget_usd": "9",
                        "rpm": 10, "tpm": 10**6}},
    )  # fmt: skip
    book = load_pricebook(path)
    settings = billing_settings.model_copy(
        update={
            "ledger_url": ledger_url,
            "stripe_api_base": server.base_url,
            "stripe_api_key": SecretStr("sk_test_customer"),
        }
    )
    with ledger.begin() as connection:
        insert_usage_events(
            connection,
            [
                # 100,000 x 3000 = 300,000,000 nano-USD: 30 cents, none of it included.
                hand_event(org, "u1", datetime(2026, 11, 4, tzinfo=UTC), tier="fast",
                           version="v1", prompt=100_000, completion=0, list_cost=300_000_000),
            ],
        )  # fmt: skip
    december = datetime(2026, 12, 2, tzinfo=UTC)
    assert sync_stripe(ledger, book, settings, december).planned == 0
    assert REGISTRY.get_sample_value("cstack_orgs_without_stripe_customer") == 1
    with ledger.connect() as connection:
        queued = connection.execute(
            select(InvoiceChange.period).where(InvoiceChange.org_id == org)
        ).scalars()
        assert list(queued) == ["2026-11"]

    CliRunner().invoke(
        cli_app,
        ["keys", "create", "--org", org],
        env={"CSTACK_REDIS_URL": settings.redis_url, "CSTACK_LEDGER_URL": ledger_url},
    )
    changed = CliRunner().invoke(
        cli_app,
        ["keys", "customer", org, "cus_Late"],
        env={"CSTACK_REDIS_URL": settings.redis_url, "CSTACK_LEDGER_URL": ledger_url},
    )
    assert changed.exit_code == 0, changed.output
    result = sync_stripe(ledger, book, settings, december)
    assert result.sent == 1
    assert REGISTRY.get_sample_value("cstack_orgs_without_stripe_customer") == 0
    items = list_invoice_items(stripe_client(settings), "cus_Late")
    assert [(i.metadata["cstack_org"], i.amount_cents) for i in items] == [(org, 30)]
