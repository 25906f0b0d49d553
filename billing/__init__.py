"""Billing: price book, admission and metering, usage ledger, Stripe.

The gateway imports billing through ``billing.contract`` only (the meter, usage reading
and accounts contracts, and the factories of their real implementations). The package
itself imports nothing, so importing one of its modules runs no other.
"""
