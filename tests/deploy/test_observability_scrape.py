"""A real Prometheus scrapes a running gateway, vLLM and the billing worker; every PromQL
expression of the dashboards and alert rules then evaluates and returns data.

The stack: the session's vLLM (both tiers share it, as in the embedded default), a gateway
with the real billing meter, `cstack worker billing` and `cstack beat` draining the usage
stream into a SQLite ledger and reporting it to a local stand-in for Stripe's meter-event
endpoint, `cstack train` stepping on the tiny checkpoint, and Debian's `prometheus`
scraping all four every second with the alert rules loaded. Traffic goes through the
`openai` SDK, including requests the meter refuses.

Exempt from "returns data" (they must still evaluate without error), because no process
here exports them:
- cstack_rollout_*, cstack_policy_staleness: the rollout workers do not export metrics yet
  (training/rollouts has no exporter to run);
- vllm:spec_decode_*: only an engine with speculative decoding exports them (the fast
  tier's MTP in production), which the tiny checkpoint on the CPU build cannot run.
The prefix-cache hit ratio returns series but may be NaN: the cpu profile of
serving/variants.yaml leaves prefix caching off, so its rate is 0/0.
"""

from __future__ import annotations

import math
import shutil
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import openai
import pytest
import yaml
from observability_support import (
    ALERTS,
    REPO,
    PrometheusApi,
    StripeStandIn,
    ThreadedGateway,
    alert_expressions,
    create_api_key,
    dashboard_expressions,
    free_port,
    prometheus_config,
    wait_until,
)
from sqlalchemy import create_engine, text

from billing.meter import create_meter
from billing.settings import BillingSettings
from gateway import GatewaySettings
from serving import ManagedProcess

pytestmark = pytest.mark.vllm

#: Expressions over these may be NaN (but must return series): prefix caching is off in the
#: cpu profile of serving/variants.yaml, so the hit ratio is 0/0 here.
NAN_ALLOWED = ("vllm:prefix_cache_",)
EXEMPT_METRICS = (
    "cstack_rollout",
    "cstack_policy_staleness",
    "vllm:spec_decode_",
)
TEST_PLANS = {
    "observed": {"included_usd": "100.00", "overage": "refused", "rpm": 100000, "tpm": 10**9},
    "one-rpm": {"included_usd": "100.00", "overage": "refused", "rpm": 1, "tpm": 10**9},
    "no-allowance": {"included_usd": "0.000001", "overage": "refused", "rpm": 100000, "tpm": 10**9},
}
CUSTOMER = "cus_observability"


@dataclass
class ObservedStack:
    prometheus: PrometheusApi
    ledger_url: str
    stripe: StripeStandIn
    refusal_codes: list[str]


def _exempt(expr: str) -> bool:
    return any(prefix in expr for prefix in EXEMPT_METRICS)


def _isolated_redis(redis_url: str) -> str:
    """The session's Valkey, in a database of its own: the Celery queue and the streams
    here must not meet the billing tests' workers."""
    return urlparse(redis_url)._replace(path="/7").geturl()


def _billing_env(tmp: Path, redis_url: str, stripe_url: str, metrics_port: int) -> dict[str, str]:
    book = yaml.safe_load((REPO / "billing" / "pricebook.yaml").read_text())
    book["plans"].update(TEST_PLANS)
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
        "CSTACK_STRIPE_MINUTE_GRACE_S": "0",
        "CSTACK_STRIPE_API_KEY": "sk_test_observability",
        "CSTACK_STRIPE_API_BASE": stripe_url,
        "CSTACK_METRICS_PORT": str(metrics_port),
    }


def _send_traffic(gateway_url: str, redis_url: str) -> list[str]:
    """Completions on both tiers (streamed and not), then requests the meter refuses."""
    key = create_api_key(redis_url, "observed-org", "observed", CUSTOMER)
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
            api_key=create_api_key(redis_url, f"{plan}-org", plan, CUSTOMER),
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


@pytest.fixture(scope="module")
def observed(
    vllm_url: str, redis_url: str, tiny_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ObservedStack]:
    prometheus_binary = shutil.which("prometheus")
    if prometheus_binary is None:
        pytest.fail("prometheus not found: apt-get install prometheus")
    tmp = tmp_path_factory.mktemp("observability")
    redis = _isolated_redis(redis_url)
    stripe = StripeStandIn()
    worker_port = free_port()
    trainer_port = free_port()
    env = _billing_env(tmp, redis, stripe.url, worker_port)
    cstack = [sys.executable, "-m", "deploy.cli"]
    worker = ManagedProcess(
        "billing worker",
        [*cstack, "worker", "billing", "--concurrency", "1", "--loglevel", "WARNING"],
        tmp / "worker.log",
        f"http://127.0.0.1:{worker_port}/metrics",
        env,
    )
    beat = ManagedProcess(
        "beat", [*cstack, "beat", "--loglevel", "WARNING"], tmp / "beat.log", None, env
    )
    # The real trainer on the tiny checkpoint, stepping until stopped; niced, so that vLLM
    # keeps the CPU it needs for the traffic.
    trainer = ManagedProcess(
        "trainer",
        [
            *("nice", "-n", "19", *cstack, "train", "--model", str(tiny_model)),
            *("--steps", "1000000", "--batch-size", "1", "--seq-len", "16"),
            *("--metrics-port", str(trainer_port)),
        ],
        tmp / "trainer.log",
        f"http://127.0.0.1:{trainer_port}/metrics",
        {"OMP_NUM_THREADS": "1"},
    )
    processes = [worker, beat, trainer]
    gateway: ThreadedGateway | None = None
    api: PrometheusApi | None = None
    try:
        for process in processes:
            process.start()
        worker.wait_healthy(timeout_s=60)
        trainer.wait_healthy(timeout_s=120)

        billing = BillingSettings.model_validate(
            {k.removeprefix("CSTACK_").lower(): v for k, v in env.items()}
        )
        dead_replica = f"http://127.0.0.1:{free_port()}"
        gateway = ThreadedGateway(
            GatewaySettings(
                port=free_port(),
                redis_url=redis,
                fast_upstream_urls=[vllm_url],
                # A second standard replica that is down: healthy < configured replicas.
                standard_upstream_urls=[vllm_url, dead_replica],
                health_interval_s=0.5,
            ),
            create_meter(billing),
        ).start()

        vllm = urlparse(vllm_url)
        config = prometheus_config(
            {
                "gateway": (urlparse(gateway.url).netloc, {"component": "gateway"}),
                "vllm": (f"{vllm.hostname}:{vllm.port}", {"component": "vllm", "tier": "shared"}),
                "billing-worker": (f"127.0.0.1:{worker_port}", {"component": "billing-worker"}),
                "trainer": (f"127.0.0.1:{trainer_port}", {"component": "trainer"}),
            },
            [ALERTS],
        )
        (tmp / "prometheus.yml").write_text(yaml.safe_dump(config))
        prometheus_url = f"http://127.0.0.1:{free_port()}"
        server = ManagedProcess(
            "prometheus",
            [
                prometheus_binary,
                f"--config.file={tmp / 'prometheus.yml'}",
                f"--storage.tsdb.path={tmp / 'tsdb'}",
                f"--web.listen-address={urlparse(prometheus_url).netloc}",
                "--log.level=warn",
            ],
            tmp / "prometheus.log",
            f"{prometheus_url}/-/ready",
        )
        processes.append(server)
        server.start()
        server.wait_healthy(timeout_s=60)
        api = PrometheusApi(prometheus_url)
        wait_until(lambda: len(api.query("up == 1")) == 4, 30, "every target to be scraped")

        # Labelled series start to exist at their first observation, and rate() counts
        # only increases Prometheus saw happen: so a first round creates the series, and
        # once they are scraped a second round is what the rates and quantiles see.
        codes = _send_traffic(gateway.url, redis)
        wait_until(
            lambda: len(api.query("cstack_time_to_first_token_seconds_count")) == 2,
            30,
            "the first round's series to be scraped",
        )
        codes += _send_traffic(gateway.url, redis)
        # The pipeline's last step: usage in the ledger reported to Stripe (once the
        # minute it happened in has closed), and Prometheus has scraped that.
        wait_until(
            # rate() needs two samples of the counter, so wait for the second scrape.
            lambda: api.query('rate(cstack_stripe_meter_events_total{result="sent"}[5m])'),
            120,
            "a Stripe meter event to be sent and scraped",
        )
        yield ObservedStack(api, env["CSTACK_LEDGER_URL"], stripe, codes)
    finally:
        if api is not None:
            api.close()
        if gateway is not None:
            gateway.stop()
        for process in reversed(processes):
            process.stop()
        stripe.stop()


def test_every_target_is_scraped(observed: ObservedStack) -> None:
    targets = observed.prometheus.get("/api/v1/targets")["activeTargets"]
    assert {t["labels"]["job"]: t["health"] for t in targets} == {
        "gateway": "up",
        "vllm": "up",
        "billing-worker": "up",
        "trainer": "up",
    }


def test_the_meter_refused_with_both_codes(observed: ObservedStack) -> None:
    assert set(observed.refusal_codes) == {"insufficient_quota", "rate_limit_exceeded"}


def test_alert_rules_load_and_evaluate_in_prometheus(observed: ObservedStack) -> None:
    api = observed.prometheus
    wait_until(
        # A rule never evaluated reports Go's zero time.
        lambda: all(
            not rule["lastEvaluation"].startswith("0001-")
            for group in api.get("/api/v1/rules")["groups"]
            for rule in group["rules"]
        ),
        30,
        "every rule to be evaluated",
    )
    rules = [rule for group in api.get("/api/v1/rules")["groups"] for rule in group["rules"]]
    assert {rule["name"] for rule in rules} == {name for name, _, _ in alert_expressions()}
    for rule in rules:
        assert rule["health"] == "ok", f"{rule['name']}: {rule.get('lastError')}"


def _assert_returns_data(api: PrometheusApi, where: str, expr: str) -> None:
    result = api.query(expr)
    if _exempt(expr):
        return
    assert result, f"{where}: no data for {expr}"
    if any(prefix in expr for prefix in NAN_ALLOWED):
        return
    values = [float(sample["value"][1]) for sample in result]
    assert any(math.isfinite(value) for value in values), f"{where}: only {values} for {expr}"


@pytest.mark.parametrize(("where", "expr"), list(dashboard_expressions()), ids=lambda v: v[:60])
def test_dashboard_expression_returns_data(observed: ObservedStack, where: str, expr: str) -> None:
    _assert_returns_data(observed.prometheus, where, expr)


@pytest.mark.parametrize(
    ("alert", "expr", "signal"), list(alert_expressions()), ids=lambda v: v[:40]
)
def test_alert_expression_evaluates_and_its_signal_returns_data(
    observed: ObservedStack, alert: str, expr: str, signal: str
) -> None:
    observed.prometheus.query(expr)
    _assert_returns_data(observed.prometheus, alert, signal)


def test_dashboard_revenue_equals_the_ledgers_list_cost(observed: ObservedStack) -> None:
    """tokens x cstack_price_nano_usd_per_token, as the revenue panels compute it, is the
    list cost billing wrote to the ledger for the same requests."""
    rows = observed.prometheus.query(
        "sum by (tier) (cstack_tokens_total * on (tier, direction) group_left"
        " max by (tier, direction) (cstack_price_nano_usd_per_token))"
    )
    from_metrics = {row["metric"]["tier"]: int(float(row["value"][1])) for row in rows}
    engine = create_engine(observed.ledger_url)
    try:
        with engine.connect() as connection:
            ledger: dict[str, int] = dict(
                connection.execute(
                    text("SELECT tier, SUM(list_cost_nano_usd) FROM usage_events GROUP BY tier")
                ).all()
            )
    finally:
        engine.dispose()
    assert set(from_metrics) == {"fast", "standard"}
    assert from_metrics == {tier: int(cost) for tier, cost in ledger.items()}


def test_stripe_received_the_meter_events_the_metrics_count(observed: ObservedStack) -> None:
    sent = observed.prometheus.query('sum(cstack_stripe_meter_events_total{result="sent"})')
    assert len(observed.stripe.events) >= int(float(sent[0]["value"][1])) > 0
    assert {event["payload[stripe_customer_id]"] for event in observed.stripe.events} == {CUSTOMER}


def test_gateway_metrics_carry_no_key_or_org_labels(observed: ObservedStack) -> None:
    labels = observed.prometheus.get("/api/v1/labels")
    assert not [name for name in labels if "key" in name or "org" in name or "customer" in name]
