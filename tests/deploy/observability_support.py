"""Helpers for the observability test: counts read from the gateway, Prometheus and the
ledger, a Prometheus client, a stand-in for Stripe's invoice-item endpoint, and the PromQL that the
dashboards and alert rules hold."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import yaml
from prometheus_client.parser import text_string_to_metric_families
from redis.asyncio import Redis
from sqlalchemy import create_engine, text
from sqlalchemy.exc import OperationalError

from gateway.access.keys import KeyStore

REPO = Path(__file__).resolve().parents[2]
DASHBOARDS = sorted((REPO / "deploy" / "grafana").glob("*.json"))
ALERTS = REPO / "deploy" / "prometheus" / "alerts.yaml"
TEST_PLANS = {
    "observed": {"included_usd": "100.00", "overage": "refused", "rpm": 100000, "tpm": 10**9},
    "one-rpm": {"included_usd": "100.00", "overage": "refused", "rpm": 1, "tpm": 10**9},
    "no-allowance": {"included_usd": "0.000001", "overage": "refused", "rpm": 100000, "tpm": 10**9},
}
CUSTOMER = "cus_observability"
#: Grafana's variables, set the way the dashboards are opened: all tiers, and a window wide
#: enough to hold the whole test's traffic.
GRAFANA_VARIABLES = {"$__rate_interval": "5m", "$tier": ".*"}
ALERT_FORM = re.compile(
    r"^(?P<signal>.+?)\s*(?:>=|<=|==|!=|>|<)\s*(?P<threshold>[0-9.e+-]+)$", re.S
)


def dashboard_expressions() -> Iterator[tuple[str, str]]:
    """``(where, PromQL)`` for every panel target, Grafana variables substituted."""
    for path in DASHBOARDS:
        dashboard = json.loads(path.read_text())
        for panel in dashboard["panels"]:
            for target in panel["targets"]:
                expr = target["expr"]
                for variable, value in GRAFANA_VARIABLES.items():
                    expr = expr.replace(variable, value)
                yield f"{path.stem}: {panel['title']} [{target['refId']}]", expr


def alert_expressions() -> Iterator[tuple[str, str, str]]:
    """``(alert, full expression, signal)``: the signal is the part before the threshold."""
    for group in yaml.safe_load(ALERTS.read_text())["groups"]:
        for rule in group["rules"]:
            expr = rule["expr"].strip()
            match = ALERT_FORM.match(expr)
            assert match, f"{rule['alert']}: not `<signal> <comparison> <number>`"
            yield rule["alert"], expr, match["signal"]


def gateway_request_count(
    gateway_url: str, routes: tuple[str, ...] | None = None, status: str | None = None
) -> int:
    """The gateway's own ``cstack_requests_total``, summed over the routes and status given."""
    body = httpx.get(f"{gateway_url}/metrics", timeout=10).text
    total = 0.0
    for family in text_string_to_metric_families(body):
        for sample in family.samples:
            if sample.name != "cstack_requests_total":
                continue
            if routes is not None and sample.labels.get("route") not in routes:
                continue
            if status is not None and sample.labels.get("status") != status:
                continue
            total += sample.value
    return int(total)


def scraped_request_count(api: PrometheusApi) -> int:
    """The gateway's completions requests as Prometheus last scraped them."""
    rows = api.query('sum(cstack_requests_total{job="gateway", route=~"chat|completions"})')
    return int(float(rows[0]["value"][1])) if rows else -1


def ledger_event_count(ledger_url: str) -> int:
    engine = create_engine(ledger_url)
    try:
        with engine.connect() as connection:
            return int(connection.execute(text("SELECT COUNT(*) FROM usage_events")).scalar_one())
    except OperationalError:  # the worker has not created the table yet
        return -1
    finally:
        engine.dispose()


def create_api_key(env: dict[str, str], org: str, plan: str) -> str:
    """A fresh key for ``org``; a new org is created on ``plan`` and billed to ``CUSTOMER``,
    set as an operator does (`cstack keys customer`: the ledger's record, which invoices
    go by, and the copy admission reads)."""

    async def create() -> tuple[str, bool]:
        redis = Redis.from_url(env["CSTACK_REDIS_URL"])
        try:
            store = KeyStore(redis, plan)
            created = await store.get_org(org) is None
            if created:
                await store.create_org(org, plan=plan)
            token, _record = await store.create_key(org, plan=plan)
            return str(token), created
        finally:
            await redis.aclose()  # type: ignore[attr-defined]

    token, created = asyncio.run(create())
    if created:
        cstack = [sys.executable, "-m", "deploy.cli"]
        for command in (["billing", "migrate"], ["keys", "customer", org, CUSTOMER]):
            subprocess.run([*cstack, *command], env={**os.environ, **env}, check=True)
    return token


def prometheus_config(
    targets: dict[str, tuple[str, dict[str, str]]], rule_files: list[Path]
) -> dict[str, Any]:
    """A config scraping each ``job: (host:port, labels)`` every second."""
    return {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(path) for path in rule_files],
        "scrape_configs": [
            {
                "job_name": job,
                "metrics_path": "/metrics",
                "static_configs": [{"targets": [address], "labels": labels}],
            }
            for job, (address, labels) in targets.items()
        ],
    }


class PrometheusApi:
    def __init__(self, url: str) -> None:
        self.client = httpx.Client(base_url=url, timeout=10.0)

    def get(self, path: str, **params: str) -> Any:
        response = self.client.get(path, params=params)
        body = response.json()
        assert body.get("status") == "success", f"{path} {params}: {body.get('error', body)}"
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        data = self.get("/api/v1/query", query=expr)
        assert data["resultType"] in {"vector", "scalar"}, data["resultType"]
        if data["resultType"] == "scalar":
            return [{"metric": {}, "value": data["result"]}]
        result: list[dict[str, Any]] = data["result"]
        return result

    def ready(self) -> bool:
        try:
            return self.client.get("/-/ready").status_code == 200
        except httpx.HTTPError:
            return False

    def close(self) -> None:
        self.client.close()


def billing_env(tmp: Path, redis_url: str, stripe_url: str, metrics_port: int) -> dict[str, str]:
    book = yaml.safe_load((REPO / "billing" / "prices" / "pricebook.yaml").read_text())
    book["plans"].update(TEST_PLANS)
    # The traffic happens now: the shipped launch promotion would change what it consumes
    # of the allowances depending on the day the test runs.
    book["promotions"] = []
    # A thousand times the list prices, from a fixed instant: the test's few short requests
    # then come to whole cents, so the worker has invoice items to post to Stripe (a line
    # that rounds to $0.00 needs none), and no shipped price change moves the outcome.
    book["versions"] = [
        {
            "version": "observability",
            "effective_from": "2026-01-01T00:00:00Z",
            "tiers": {
                "standard": {"input_per_1m": "500.00", "output_per_1m": "2500.00"},
                "fast": {"input_per_1m": "3000.00", "output_per_1m": "15000.00"},
            },
        }
    ]
    (tmp / "pricebook.yaml").write_text(yaml.safe_dump(book))
    suffix = uuid.uuid4().hex[:8]
    return {
        "CSTACK_REDIS_URL": redis_url,
        "CSTACK_PRICEBOOK_PATH": str(tmp / "pricebook.yaml"),
        "CSTACK_LEDGER_URL": f"sqlite:///{tmp / 'ledger.db'}",
        "CSTACK_USAGE_STREAM": f"cstack:usage:{suffix}",
        "CSTACK_USAGE_DEAD_LETTER_STREAM": f"cstack:usage:dead:{suffix}",
        "CSTACK_USAGE_SPOOL_DIR": str(tmp / "spool"),
        "CSTACK_BEAT_SCHEDULE_FILE": str(tmp / "beat-schedule"),
        "CSTACK_LEDGER_DRAIN_INTERVAL_S": "0.5",
        "CSTACK_STRIPE_SYNC_INTERVAL_S": "1",
        # Post the running month on every sync, so the worker's Stripe metrics move.
        "CSTACK_STRIPE_POST_OPEN_PERIODS": "true",
        "CSTACK_STRIPE_API_KEY": "sk_test_observability",
        "CSTACK_STRIPE_API_BASE": stripe_url,
        "CSTACK_METRICS_PORT": str(metrics_port),
    }


def send_traffic(gateway_url: str, env: dict[str, str]) -> list[str]:
    """Completions on both tiers (streamed and not), then requests the meter refuses
    (``env``: the billing processes' settings)."""
    key = create_api_key(env, "observed-org", "observed")
    client = openai.OpenAI(base_url=f"{gateway_url}/v1", api_key=key, max_retries=0)
    client.models.list()
    for model in ("composer-2.5-fast", "composer-2.5-standard"):
        messages: Any = [{"role": "user", "content": "Count to three."}]
        client.chat.completions.create(model=model, messages=messages, max_tokens=8)
        stream = client.chat.completions.create(
            model=model,
            messages=messages,
            max_tokens=8,
            stream=True,
            stream_options={"include_usage": True},
        )
        assert [chunk for chunk in stream]
        client.completions.create(model=model, prompt="One, two,", max_tokens=8)

    codes = []
    for plan, attempts in (("one-rpm", 2), ("no-allowance", 1)):
        limited = openai.OpenAI(
            base_url=f"{gateway_url}/v1",
            api_key=create_api_key(env, f"{plan}-org", plan),
            max_retries=0,
        )
        for _ in range(attempts):
            try:
                limited.chat.completions.create(
                    model="composer-2.5-fast",
                    messages=[{"role": "user", "content": "Hi"}],
                    max_tokens=4,
                )
            except openai.RateLimitError as refused:
                codes.append(str(refused.code))
    return codes
