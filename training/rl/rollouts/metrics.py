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
#: The reward-hack monitor: rollouts any rule (or the reviewer) flagged, each rule that
#: fired, and the reviewer's verdicts. Rule and verdict names are a fixed, small set.
MONITOR_FLAGGED = Counter(
    "cstack_rollout_monitor_flagged_total", "Rollouts the monitor zeroed.", ["env"]
)
MONITOR_RULES = Counter(
    "cstack_rollout_monitor_verdicts_total", "Monitor rules that fired.", ["env", "rule"]
)
MONITOR_REVIEWS = Counter(
    "cstack_rollout_monitor_reviews_total", "Reviews of suspicious rollouts.", ["env", "verdict"]
)
