"""Billing's Prometheus metrics (names fixed by the metrics contract; no org/key labels).

Gateway-side metrics live in the default registry, which the gateway's /metrics serves;
the worker and beat serve the same registry on ``CSTACK_METRICS_PORT``. The gauges name a
``multiprocess_mode`` for ``cstack gateway --workers N``, whose /metrics sums its workers'
samples (gateway/metrics.py): each of these is a value every process sees alike (prices,
the spool directory, the stream), so the largest of the running workers', not a sum.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

admission_refusals = Counter(
    "cstack_admission_refusals_total", "Requests refused by admission.", ["tier", "code"]
)
admission_seconds = Histogram(
    "cstack_admission_seconds",
    "Time spent in the admission check.",
    buckets=(0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.1, 0.5),
)
admission_leases = Counter(
    "cstack_admission_leases_total",
    "Busy keys' leases (billing/meter/leases.py): grants from Redis, requests admitted on a "
    "lease, leases given back.",
    ["outcome"],
)
for _outcome in ("granted", "admitted", "returned"):
    admission_leases.labels(_outcome)
usage_events = Counter("cstack_usage_events_total", "Usage events emitted.", ["tier", "outcome"])
usage_spool_events = Gauge(
    "cstack_usage_spool_events",
    "Usage events waiting in this process's disk spool.",
    multiprocess_mode="livemax",
)
price_nano_usd_per_token = Gauge(
    "cstack_price_nano_usd_per_token",
    "Current list price per token from the price book.",
    ["tier", "direction"],
    multiprocess_mode="livemax",
)

usage_stream_lag = Gauge(
    "cstack_usage_stream_lag_events",
    "Usage stream entries not yet in the ledger.",
    multiprocess_mode="livemax",
)
usage_dead_letters = Gauge(
    "cstack_usage_dead_letters",
    "Usage events set aside as unwritable; `cstack billing dead-letters` lists and replays them.",
    multiprocess_mode="livemax",
)
ledger_rows = Counter("cstack_ledger_rows_total", "Usage rows written to the ledger.")
stripe_invoice_items = Counter(
    "cstack_stripe_invoice_items_total",
    "Stripe invoice item requests by result (sent, failed).",
    ["result"],
)
# Both results exist from the start, so rate() and the dashboards have series before the
# first failure.
for _result in ("sent", "failed"):
    stripe_invoice_items.labels(_result)
stripe_sync_failures = Counter(
    "cstack_stripe_sync_failures_total", "Stripe sync runs that hit an error."
)
stripe_last_success = Gauge(
    "cstack_stripe_last_success_timestamp_seconds",
    "When a Stripe sync last succeeded.",
    multiprocess_mode="livemax",
)
orgs_without_stripe_customer = Gauge(
    "cstack_orgs_without_stripe_customer",
    "Orgs with usage this month or last and no Stripe customer: their usage is not "
    "invoiced until an admin sets one (`cstack billing reconcile --all` lists them).",
    multiprocess_mode="livemax",
)
# The daily `cstack billing reconcile --all` of the billing worker (stripe/reconcile_all.py).
# No org or customer id as a label (they identify customers, and a series per org would
# grow with the customer base): the count of orgs that differ and the sum of their
# absolute differences; the worker's log names each org with its difference.
reconcile_orgs_differing = Gauge(
    "cstack_billing_reconcile_orgs_differing",
    "Orgs whose Stripe items differed from the ledger's invoice at the last daily reconcile.",
    multiprocess_mode="livemax",
)
reconcile_difference_nano_usd = Gauge(
    "cstack_billing_reconcile_difference_nano_usd",
    "Sum over orgs of the absolute difference between Stripe's items and the ledger's "
    "invoice lines at the last daily reconcile (nano-USD).",
    multiprocess_mode="livemax",
)
reconcile_upcoming_difference_nano_usd = Gauge(
    "cstack_billing_reconcile_upcoming_difference_nano_usd",
    "Sum over customers of what their upcoming Stripe invoice holds beyond the ledger's "
    "items and the items not from the ledger, at the last daily reconcile (nano-USD).",
    multiprocess_mode="livemax",
)
reconcile_last_run = Gauge(
    "cstack_billing_reconcile_last_run_timestamp_seconds",
    "When the daily reconcile last completed.",
    multiprocess_mode="livemax",
)
