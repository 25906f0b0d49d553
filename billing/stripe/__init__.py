"""Stripe: the invoice items that mirror the ledger's invoice lines, each org's customer, the
webhook and its router, and reconciliation of Stripe against the ledger."""
