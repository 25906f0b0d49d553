"""Billing: price book, admission and metering, usage ledger, Stripe."""
