"""The gateway's Prometheus metrics (names fixed by the metrics contract; no key/org labels).

Each app gets its own registry so several gateways can live in one process (tests, the
benchmark); ``/metrics`` renders it together with the process-wide default registry, where
the billing meter registers its own ``cstack_`` metrics.

Under ``cstack gateway --workers N`` (gateway/server/supervisor.py) every worker writes its
samples to the directory in PROMETHEUS_MULTIPROC_DIR and ``/metrics``, whichever worker
answers it, renders all workers' samples from there: counters and histograms summed, each
gauge as its ``multiprocess_mode`` says (``live*``: only running workers count). The
per-process ``process_*``/``python_*`` collectors are left out then: no sum of them means
anything.
"""

from __future__ import annotations

import os

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import generate_latest

ROUTES = ("chat", "completions", "responses", "models", "usage", "other")
OVERHEAD_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.1, 0.5, 2.5)
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class GatewayMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(
            "cstack_requests", "Requests answered.", ["tier", "route", "status"], registry=r
        )
        self.duration = Histogram(
            "cstack_request_duration_seconds",
            "Whole-request latency, streams until their last byte.",
            ["tier", "route"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.ttft = Histogram(
            "cstack_time_to_first_token_seconds",
            "Time from request arrival to the first streamed token.",
            ["tier"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.overhead = Histogram(
            "cstack_gateway_overhead_seconds",
            "Time a request spent in the gateway outside the upstream (x-cstack-overhead-ms): "
            "a whole answer's, or a stream's until its response head.",
            ["tier"],
            buckets=OVERHEAD_BUCKETS,
            registry=r,
        )
        self.tokens = Counter(
            "cstack_tokens", "Tokens as vLLM counted them.", ["tier", "direction"], registry=r
        )
        self.upstream_errors = Counter(
            "cstack_upstream_errors", "Upstream failures.", ["tier", "kind"], registry=r
        )
        self.upstream_retries = Counter(
            "cstack_upstream_retries", "Requests retried on another replica.", ["tier"], registry=r
        )
        self.inflight = Gauge(
            "cstack_inflight_requests",
            "Requests being served.",
            ["tier"],
            registry=r,
            multiprocess_mode="livesum",
        )
        self.upstream_healthy = Gauge(
            "cstack_upstream_healthy",
            "Healthy replicas in the pool.",
            ["tier"],
            registry=r,
            # Each worker checks health itself: healthy as every worker sees it.
            multiprocess_mode="livemin",
        )
        self.tier_overflows = Counter(
            "cstack_tier_overflows",
            "Fast requests served (and billed) as standard: fast was full, the org allows it.",
            registry=r,
        )
        self.upstream_replicas = Gauge(
            "cstack_upstream_replicas",
            "Configured replicas in the pool.",
            ["tier"],
            registry=r,
            multiprocess_mode="livemax",
        )

        self._request_children: dict[tuple[str, str, int], tuple[Counter, Histogram]] = {}
        #: Every worker's samples (the module docstring), when this process is one of several.
        self._workers_registry: CollectorRegistry | None = None
        if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
            from prometheus_client import multiprocess

            self._workers_registry = CollectorRegistry()
            multiprocess.MultiProcessCollector(self._workers_registry)

    def count_request(self, tier: str, route: str, status: int, seconds: float) -> None:
        """One finished request; label children are cached (``labels()`` is not free)."""
        key = (tier, route, status)
        children = self._request_children.get(key)
        if children is None:
            children = (
                self.requests.labels(tier, route, str(status)),
                self.duration.labels(tier, route),
            )
            self._request_children[key] = children
        children[0].inc()
        children[1].observe(seconds)

    def render(self) -> bytes:
        if self._workers_registry is not None:
            return generate_latest(self._workers_registry)
        return generate_latest(self.registry) + generate_latest(REGISTRY)
