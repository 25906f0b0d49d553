"""A real Prometheus scrapes a running gateway, vLLM and the billing worker; every PromQL
expression of the dashboards and alert rules then evaluates and returns data.

The stack: the session's vLLM (both tiers share it, as in the embedded default), a gateway
with the real billing meter and two worker processes, `cstack worker billing` and `cstack
beat` draining the usage stream into a SQLite ledger and posting it to a local stand-in for
Stripe's invoice-item endpoint, `cstack train` stepping on the tiny checkpoint, and
Debian's `prometheus` scraping all four every second with the alert rules loaded. Traffic
goes through the `openai` SDK, including requests the meter refuses.

Exempt from "returns data" (they must still evaluate without error), because no process
here exports them:
- cstack_rollouts_total, cstack_rollout_reward: no rollout worker runs in this stack (a
  real worker's /metrics is checked in tests/training/rl/rollouts/test_rollout_workers.py);
- cstack_policy_staleness: the RL loop observes it after an optimizer step that pushed new
  weights into vLLM through its dev endpoints; that loop is not run here (the session's
  vLLM is shared, and `cstack rl` starts a vLLM of its own);
- cstack_rl_*: set by that same loop after each step (tests/training/rl covers them);
- vllm:spec_decode_*: only an engine with speculative decoding exports them (the fast
  tier's MTP in production), which the tiny checkpoint on the CPU build cannot run.
The prefix-cache hit ratio returns series but may be NaN: the cpu profile of
serving/variants.yaml leaves prefix caching off, so its rate is 0/0.
"""

from __future__ import annotations

import math
import shutil
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

import pytest
import yaml
from observability_support import (
    ALERTS,
    CUSTOMER,
    PrometheusApi,
    alert_expressions,
    billing_env,
    dashboard_expressions,
    gateway_request_count,
    ledger_event_count,
    prometheus_config,
    scraped_request_count,
    send_traffic,
)
from sqlalchemy import create_engine, text

from serving.process import ManagedProcess, free_port
from tests.support.fakes.stripe import StripeStandIn, start_stripe_stand_in
from tests.support.waits import wait_until

pytestmark = pytest.mark.vllm

#: Expressions over these may be NaN (but must return series): prefix caching is off in the
#: cpu profile of serving/variants.yaml, so the hit ratio is 0/0 here.
NAN_ALLOWED = ("vllm:prefix_cache_",)
EXEMPT_METRICS = (
    "cstack_rollout",
    "cstack_policy_staleness",
    "cstack_rl_",
    "vllm:spec_decode_",
)


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


@pytest.fixture(scope="module")
def observed(
    vllm_url: str, redis_url: str, tiny_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ObservedStack]:
    prometheus_binary = shutil.which("prometheus")
    if prometheus_binary is None:
        pytest.fail("prometheus not found: apt-get install prometheus")
    tmp = tmp_path_factory.mktemp("observability")
    redis = _isolated_redis(redis_url)
    stripe = start_stripe_stand_in(tmp)
    worker_port = free_port()
    trainer_port = free_port()
    env = billing_env(tmp, redis, stripe.base_url, worker_port)
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
    gateway_url = f"http://127.0.0.1:{free_port()}"
    internal_url = f"http://127.0.0.1:{free_port()}"  # /metrics
    dead_replica = f"http://127.0.0.1:{free_port()}"
    # Two workers, as the chart runs it on a pod of two cores: every expression must hold
    # over the workers' combined metrics (prometheus_client's multiprocess mode).
    gateway = ManagedProcess(
        "gateway",
        [*cstack, "gateway", "--log-level", "warning", "--workers", "2"],
        tmp / "gateway.log",
        f"{gateway_url}/healthz",
        {
            **env,
            "CSTACK_PORT": str(urlparse(gateway_url).port),
            "CSTACK_INTERNAL_PORT": str(urlparse(internal_url).port),
            "CSTACK_FAST_UPSTREAM_URLS": vllm_url,
            # A second standard replica that is down: healthy < configured replicas.
            "CSTACK_STANDARD_UPSTREAM_URLS": f"{vllm_url},{dead_replica}",
            "CSTACK_HEALTH_INTERVAL_S": "0.5",
        },
    )
    processes = [worker, beat, trainer, gateway]
    api: PrometheusApi | None = None
    try:
        for process in processes:
            process.start()
        worker.wait_healthy(timeout_s=60)
        gateway.wait_healthy(timeout_s=60)
        trainer.wait_healthy(timeout_s=120)

        vllm = urlparse(vllm_url)
        config = prometheus_config(
            {
                "gateway": (urlparse(internal_url).netloc, {"component": "gateway"}),
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
        wait_until(lambda: len(api.query("up == 1")) == 4, "every target to be scraped", 30)

        # Labelled series start to exist at their first observation, and rate() counts
        # only increases Prometheus saw happen: so a first round creates the series, and
        # once they are scraped a second round is what the rates and quantiles see.
        codes = send_traffic(gateway_url, env)
        # Both the completions' series and the refusals' (the round's last requests: a
        # scrape between the two would leave the refusals a single sample, after round 2,
        # and rate() nothing to compute).
        wait_until(
            lambda: (
                len(api.query("cstack_time_to_first_token_seconds_count")) == 2
                and len(api.query("cstack_admission_refusals_total")) == 2
            ),
            "the first round's series to be scraped",
            30,
        )
        codes += send_traffic(gateway_url, env)
        # Prometheus has scraped the gateway after the second round: its count of
        # completions requests is the gateway's own (scrapes count as requests too).
        served = gateway_request_count(internal_url, routes=("chat", "completions"))
        wait_until(
            lambda: scraped_request_count(api) == served,
            "the second round's requests to be scraped",
            30,
        )
        # The pipeline's last steps: every metered request in the ledger, and usage posted
        # to Stripe as invoice items (the running month, CSTACK_STRIPE_POST_OPEN_PERIODS)
        # and scraped from the worker.
        answered = gateway_request_count(internal_url, routes=("chat", "completions"), status="200")
        wait_until(
            lambda: ledger_event_count(env["CSTACK_LEDGER_URL"]) == answered,
            f"the ledger to hold the {answered} answered requests",
            120,
        )
        wait_until(
            lambda: api.query(
                'cstack_stripe_invoice_items_total{result="sent", job="billing-worker"} > 0'
            ),
            "a Stripe invoice item to be sent and scraped",
            120,
        )
        # One more scrape of every target after all of it: every series, however late it
        # was born, then has two samples, which rate() and increase() need.
        settled = time.time()
        wait_until(
            lambda: min(float(s["value"][1]) for s in api.query("timestamp(up)")) > settled,
            "every target to be scraped once more",
            30,
        )
        yield ObservedStack(api, env["CSTACK_LEDGER_URL"], stripe, codes)
    finally:
        if api is not None:
            api.close()
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
        "every rule to be evaluated",
        30,
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


def test_stripe_received_the_invoice_items_the_metrics_count(observed: ObservedStack) -> None:
    sent = observed.prometheus.query(
        'sum(cstack_stripe_invoice_items_total{result="sent", job="billing-worker"})'
    )
    # Each sent request is an item made, changed in place or removed (not a listing).
    executed = [
        request
        for request in observed.stripe.requests()
        if request["path"].startswith("/v1/invoiceitems")
        and request["method"] != "GET"
        and request["result"] == "accepted"
    ]
    assert len(executed) >= int(float(sent[0]["value"][1])) > 0
    made = observed.stripe.accepted("/v1/invoiceitems")
    assert made and {item["customer"] for item in made} == {CUSTOMER}


def test_gateway_metrics_carry_no_key_or_org_labels(observed: ObservedStack) -> None:
    labels = observed.prometheus.get("/api/v1/labels")
    assert not [name for name in labels if "key" in name or "org" in name or "customer" in name]
