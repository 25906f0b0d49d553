"""The trainer's Prometheus metrics (names from the shared metrics contract)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

from prometheus_client import Gauge, Histogram, start_http_server


@dataclass(frozen=True)
class TrainerMetrics:
    step: Gauge
    step_seconds: Histogram
    loss: Gauge
    tokens_per_second: Gauge
    last_step_timestamp: Gauge
    max_attention_logit: Gauge
    qk_clipped_heads: Gauge

    def record_attention(self, max_logit: float, clipped_heads: int) -> None:
        """Max over every layer and head (one series, not one per head) and QK-clip's count."""
        self.max_attention_logit.set(max_logit)
        self.qk_clipped_heads.set(clipped_heads)

    def record(self, step: int, seconds: float, loss: float, tokens: int, at: float) -> None:
        self.step.set(step)
        self.step_seconds.observe(seconds)
        self.loss.set(loss)
        self.tokens_per_second.set(tokens / seconds if seconds > 0 else 0.0)
        self.last_step_timestamp.set(at)


@cache
def trainer_metrics() -> TrainerMetrics:
    """Registered once per process (the default registry rejects duplicates)."""
    return TrainerMetrics(
        step=Gauge("cstack_trainer_step", "Optimizer steps completed."),
        step_seconds=Histogram(
            "cstack_trainer_step_seconds",
            "Wall time of one optimizer step (forward, backward, optimizer).",
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300),
        ),
        loss=Gauge("cstack_trainer_loss", "Loss of the last step (global token mean)."),
        tokens_per_second=Gauge(
            "cstack_trainer_tokens_per_second", "Tokens per second, last step."
        ),
        last_step_timestamp=Gauge(
            "cstack_trainer_last_step_timestamp_seconds", "Unix time the last step finished."
        ),
        max_attention_logit=Gauge(
            "cstack_trainer_max_attention_logit",
            "Largest pre-softmax attention logit of the last step, over all layers and heads.",
        ),
        qk_clipped_heads=Gauge(
            "cstack_trainer_qk_clipped_heads",
            "Attention heads whose q/k weights QK-clip rescaled after the last step.",
        ),
    )


def serve_metrics(port: int) -> None:
    start_http_server(port)
