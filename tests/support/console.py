"""Helpers for the console tests: the real gateway app with billing's real ledger reader on
real sockets (uvicorn in a thread, both listeners, as `cstack gateway` serves them), usage
priced by billing's own pricing into a real ledger, and headless Chromium."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import uvicorn
from redis.asyncio import Redis
from selenium import webdriver
from sqlalchemy import Engine

from billing.ledger.usage_reader import LedgerUsageReader
from billing.meter.events import UsageEvent
from billing.meter.protocol import UnmeteredMeter
from billing.prices.pricebook import PriceBook
from billing.prices.pricing import charge
from billing.settings import DEFAULT_PRICEBOOK_PATH
from billing.stripe.customers import LedgerAccounts
from gateway.access.keys import KeyStore
from gateway.app import create_app
from gateway.server.listeners import bind_listeners, server_config
from gateway.settings import GatewaySettings
from serving.process import free_port

ADMIN_TOKEN = "console-admin-token"
CHROMEDRIVER = "/usr/bin/chromedriver"
#: Org A has more receipts this month than one page of the table holds.
RECEIPTS_A = 30


class ConsoleGateway:
    """The gateway app with billing's ledger reader and accounts on ``ledger_url``;
    ``url`` is the public listener (the console), ``internal_url`` the admin one."""

    def __init__(self, redis_url: str, ledger_url: str) -> None:
        values: dict[str, Any] = {
            "port": free_port(),
            "internal_port": free_port(),
            "host": "127.0.0.1",
            "redis_url": redis_url,
            "admin_token": ADMIN_TOKEN,
            # No engine: the console reads Redis and the ledger only.
            "upstream_url": "http://127.0.0.1:9",
        }
        self.settings = GatewaySettings(**values)
        self.app = create_app(
            self.settings,
            UnmeteredMeter(),
            LedgerUsageReader(ledger_url, DEFAULT_PRICEBOOK_PATH),
            accounts=LedgerAccounts(ledger_url),
        )
        config = server_config(
            self.app,
            self.settings,
            host="127.0.0.1",
            log_level="warning",
            timeout_graceful_shutdown=2,
        )
        self.server = uvicorn.Server(config)
        sockets = bind_listeners(self.settings)
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": sockets}, daemon=True
        )
        self.url = f"http://127.0.0.1:{self.settings.port}"
        self.internal_url = f"http://127.0.0.1:{self.settings.internal_port}"

    def start(self) -> ConsoleGateway:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("gateway did not start")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=15)


@dataclass(frozen=True)
class Org:
    org_id: str
    key: str
    key_id: str


@dataclass(frozen=True)
class Console:
    gateway: ConsoleGateway
    engine: Engine
    book: PriceBook
    a: Org
    b: Org
    screenshots: Path


async def make_org(redis_url: str, org_id: str, plan: str) -> Org:
    redis = Redis.from_url(redis_url)
    try:
        store = KeyStore(redis, "default")
        await store.create_org(org_id, plan=plan)
        token, record = await store.create_key(org_id, name="console test")
        return Org(org_id, token, record.key_id)
    finally:
        await redis.aclose()  # type: ignore[attr-defined]


def priced_event(
    book: PriceBook,
    org: str,
    number: int,
    started: datetime,
    *,
    key_id: str,
    plan: str,
    tier: str = "standard",
    model: str = "composer-2.5",
    prompt: int = 1000,
    completion: int = 500,
) -> UsageEvent:
    """A request's usage event, priced as the gateway's meter prices it."""
    priced = charge(
        book,
        tier=tier,  # type: ignore[arg-type]
        model=model,
        prompt_tokens=prompt,
        cached_tokens=0,
        completion_tokens=completion,
        at=started,
    )
    return UsageEvent(
        event_id=f"req_{org}_{number:04d}",
        org_id=org,
        key_id=key_id,
        plan=plan,
        model=model,
        tier=tier,  # type: ignore[arg-type]
        prompt_tokens=prompt,
        cached_tokens=0,
        completion_tokens=completion,
        client_request_id=f"client-{org}-{number}",
        list_cost_nano_usd=priced.list_cost_nano,
        allowance_cost_nano_usd=priced.allowance_cost_nano,
        promotion_multiplier=str(priced.usage_multiplier),
        promotion_id=priced.promotion_id,
        price_version=priced.price_version,
        started_at=started,
        ended_at=started,
        outcome="complete",
    )


def chromium() -> webdriver.Chrome:
    """Headless Chromium (Debian's chromium and chromium-driver) at a desktop size."""
    options = webdriver.ChromeOptions()
    for argument in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--window-size=1280,1000",
    ):
        options.add_argument(argument)
    return webdriver.Chrome(options=options, service=webdriver.ChromeService(CHROMEDRIVER))


def navigate(driver: Any, element: Any) -> None:
    """Click ``element`` (a link or a form's button) and wait until the next page has
    replaced this one: a find right after a click could read the old page."""
    from selenium.common.exceptions import WebDriverException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions
    from selenium.webdriver.support.ui import WebDriverWait

    page = driver.find_element(By.TAG_NAME, "html")
    element.click()
    # Asked about the old page mid-navigation, chromedriver can answer "unhandled inspector
    # error" instead of "stale element" (seen in a CI run): ask again.
    WebDriverWait(driver, 30, ignored_exceptions=(WebDriverException,)).until(
        expected_conditions.staleness_of(page)
    )
