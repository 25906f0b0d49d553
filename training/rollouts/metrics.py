"""Rollout metrics (names from the metrics contract; the env label only)."""

from __future__ import annotations

from prometheus_client import Counter, Histogram

ROLLOUTS = Counter("cstack_rollouts_total", "Rollouts published.", ["env"])
REWARD = Histogram(
    "cstack_rollout_reward", "Reward of published rollouts.", ["env"],
    buckets=(0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 1.0),
)  # fmt: skip
STALENESS = Histogram(
    "cstack_policy_staleness", "Policy versions between sampling and training.",
    buckets=(0, 1, 2, 3, 4, 6, 8, 16),
)  # fmt: skip
