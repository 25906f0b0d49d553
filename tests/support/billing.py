"""What the billing tests share: test price books, org customers, the CSTACK_ environment of
a subprocess, real `cstack` processes, a process hammering the meter, and reads of the
usage stream. Requests and usage events to feed billing are in ``tests.support.builders``."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml
from redis.asyncio import Redis
from sqlalchemy import Engine

from billing.meter.keyspace import Keyspace
from billing.settings import DEFAULT_PRICEBOOK_PATH, BillingSettings
from billing.stripe.customers import set_org_customer
from gateway.access.keys import ApiKey, KeyStore
from tests.support.builders import admission_request, usage_for

REPO = Path(__file__).resolve().parents[2]
CSTACK = str(Path(sys.executable).with_name("cstack"))


def port_open(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def shipped_book() -> dict[str, Any]:
    return dict(yaml.safe_load(DEFAULT_PRICEBOOK_PATH.read_text()))


#: The launch prices as the tests' own price version. Tests that price "now" (admission,
#: settlement) must not follow the shipped book: a new shipped version or a promotion
#: window would change their outcome on the day it starts.
TEST_VERSIONS: list[dict[str, Any]] = [
    {
        "version": "2026-11-01",
        "effective_from": "2026-11-01T00:00:00Z",
        "tiers": {
            "standard": {"input_per_1m": "0.50", "output_per_1m": "2.50"},
            "fast": {"input_per_1m": "3.00", "output_per_1m": "15.00"},
        },
    }
]


def write_book(
    path: Path, *, promotions: list[dict[str, Any]] | None = None, **plans: dict[str, Any]
) -> Path:
    """The shipped plans plus ``plans``, priced by ``TEST_VERSIONS``, with no promotion
    unless the test gives its own (with fixed instants)."""
    return write_test_book(
        path,
        versions=TEST_VERSIONS,
        plans={**shipped_book()["plans"], **plans},
        promotions=promotions,
    )


def write_test_book(
    path: Path,
    *,
    versions: list[dict[str, Any]],
    plans: dict[str, dict[str, Any]],
    promotions: list[dict[str, Any]] | None = None,
) -> Path:
    """A price book written out in full by the test: nothing from the shipped one, so no
    outcome depends on today's date relative to the shipped versions and promotions."""
    book = {"versions": versions, "plans": plans, "promotions": promotions or []}
    path.write_text(yaml.safe_dump(book))
    return path


def set_customers(engine: Engine, customers: dict[str, str | None]) -> None:
    """Each org's Stripe customer, as an admin sets it (``cstack keys customer``)."""
    with engine.begin() as connection:
        for org, customer in customers.items():
            set_org_customer(connection, org, customer, datetime.now(UTC))


def settings_env(values: dict[str, Any]) -> dict[str, str]:
    """``BillingSettings`` field values as the CSTACK_ environment a subprocess reads."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CSTACK_")}
    env.update({f"CSTACK_{k.upper()}": str(v) for k, v in values.items() if v is not None})
    env["OMP_NUM_THREADS"] = "1"
    return env


class Process:
    """A real `cstack ...` process with its output in a log file."""

    def __init__(self, args: list[str], env: dict[str, str], log: Path) -> None:
        self.log = log
        self._handle = log.open("ab")
        self.popen = subprocess.Popen(
            [CSTACK, *args], env=env, cwd=REPO, stdout=self._handle, stderr=subprocess.STDOUT
        )

    def kill(self) -> None:
        """SIGKILL: no chance to finish a batch or acknowledge anything."""
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGKILL)
            self.popen.wait(timeout=10)

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.terminate()
            try:
                self.popen.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.kill()
        self._handle.close()


def hammer_meter(settings_json: str, org: str, requests: int, seed: int) -> tuple[int, int]:
    """Run in its own OS process: ``requests`` concurrent admit+settle cycles for ``org``.

    Each admitted request ends with a random number of output tokens up to its maximum,
    as real generations do. Returns (admitted, refused).
    """
    import asyncio
    import random

    from billing.meter.protocol import AdmissionRefused
    from billing.meter.redis_meter import RedisMeter
    from billing.settings import BillingSettings

    settings = BillingSettings.model_validate_json(settings_json)
    rng = random.Random(seed)

    async def one(meter: RedisMeter) -> bool:
        request = admission_request(
            org=org, key=f"key-{seed}", plan="tiny", prompt=100, max_output=50
        )
        try:
            admission = await meter.admit(request)
        except AdmissionRefused:
            return False
        await asyncio.sleep(rng.random() * 0.05)
        await meter.settle(admission, usage_for(request, completion=rng.randint(0, 50)))
        return True

    async def run() -> tuple[int, int]:
        meter = RedisMeter(settings)
        try:
            results = await asyncio.gather(*(one(meter) for _ in range(requests)))
        finally:
            await meter.aclose()
        return sum(results), requests - sum(results)

    return asyncio.run(run())


def keyspace(settings: BillingSettings) -> Keyspace:
    """The key names of ``settings``' Redis state (a test's own usage streams)."""
    return Keyspace(settings.billing_shards, settings.usage_stream)


def usage_entries(client: Any, settings: BillingSettings) -> list[tuple[bytes, dict[bytes, bytes]]]:
    """Every usage stream entry waiting for the ledger, over all shards' streams (each
    stream's in order; a sync redis-py client)."""
    entries: list[tuple[bytes, dict[bytes, bytes]]] = []
    for stream in keyspace(settings).usage_streams():
        entries += client.xrange(stream)
    return entries


def usage_backlog(client: Any, settings: BillingSettings) -> int:
    """Entries in all of ``settings``' usage streams."""
    return sum(client.xlen(stream) for stream in keyspace(settings).usage_streams())


async def create_org_key(redis_url: str, org: str, plan: str) -> tuple[str, ApiKey]:
    """A new org on ``plan`` and a key of it, in the key store at ``redis_url``:
    ``(plaintext, record)``."""
    client = Redis.from_url(redis_url)
    try:
        store = KeyStore(client, plan)
        await store.create_org(org, plan=plan)
        return await store.create_key(org, plan=plan)
    finally:
        await client.aclose()
