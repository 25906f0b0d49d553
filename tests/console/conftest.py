"""Console fixtures: one live gateway over real Valkey and a migrated ledger holding two orgs'
usage (this month's, in the launch week's promotion when it runs, and last month's), a
key per org, and headless Chromium."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from time import time_ns

import pytest
from selenium import webdriver

from billing.ledger import make_engine, migrate
from billing.ledger.writes import insert_usage_events
from billing.prices.pricing import load_pricebook
from billing.settings import DEFAULT_PRICEBOOK_PATH
from tests.support.console import (
    RECEIPTS_A,
    Console,
    ConsoleGateway,
    chromium,
    make_org,
    priced_event,
)


def month_start(moment: datetime) -> datetime:
    return moment.replace(day=1, hour=0, minute=0, second=0, microsecond=0)


@pytest.fixture(scope="module")
def console(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Console]:
    tmp = tmp_path_factory.mktemp("console")
    ledger_url = f"sqlite:///{tmp / 'ledger.db'}"
    engine = make_engine(ledger_url)
    migrate(engine)
    book = load_pricebook(DEFAULT_PRICEBOOK_PATH)
    suffix = f"{time_ns() % 10**9:09d}"
    a = asyncio.run(make_org(redis_url, f"org-a-{suffix}", "pro"))
    b = asyncio.run(make_org(redis_url, f"org-b-{suffix}", "free"))
    now = datetime.now(UTC).replace(microsecond=0)
    first = month_start(now)
    last_month = month_start(first - timedelta(days=1)) + timedelta(days=14, hours=9)
    events = [
        priced_event(
            book,
            a.org_id,
            number,
            # Spread over this month's days so far, the last one a minute ago.
            first + (now - first - timedelta(minutes=1)) * number / (RECEIPTS_A - 1),
            key_id=a.key_id,
            plan="pro",
            tier="fast" if number % 3 == 0 else "standard",
            model="composer-2.5" if number % 2 else "composer-2.5-standard",
            prompt=2000 + 100 * number,
            completion=400_000 if number == 7 else 800 + 10 * number,
        )
        for number in range(RECEIPTS_A)
    ]
    events += [
        priced_event(
            book,
            a.org_id,
            100 + n,
            last_month + timedelta(hours=n),
            key_id=a.key_id,
            plan="pro",
            tier="fast",
        )
        for n in range(3)
    ]
    events += [
        priced_event(
            book,
            b.org_id,
            n,
            now - timedelta(minutes=5 + n),
            key_id=b.key_id,
            plan="free",
            prompt=777,
            completion=333,
        )
        for n in range(2)
    ]
    with engine.begin() as connection:
        insert_usage_events(connection, events)
    gateway = ConsoleGateway(redis_url, ledger_url).start()
    screenshots = tmp / "screenshots"
    screenshots.mkdir()
    try:
        yield Console(gateway, engine, book, a, b, screenshots)
    finally:
        gateway.stop()
        engine.dispose()


@pytest.fixture(scope="module")
def browser() -> Iterator[webdriver.Chrome]:
    driver = chromium()
    try:
        yield driver
    finally:
        driver.quit()
