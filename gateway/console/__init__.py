"""The console in the browser: server-rendered pages on the gateway's own listeners.

``/console`` (public listener) is an org's: sign in with one of its API keys to see its
spend, usage, receipts, invoice preview and keys. ``/admin/console`` (internal listener)
is the operators': sign in with the admin token to see every org and the tiers' live
metrics, and to manage keys, default tiers and Stripe customers. ``add_console_routes``
adds both to the gateway's app.
"""

from __future__ import annotations

from redis.asyncio import Redis
from starlette.applications import Starlette

from billing.contract import BillingAccounts, UsageReader
from gateway.access.auth import Authenticator
from gateway.access.keys import KeyStore
from gateway.console.access import PREFIX, Access
from gateway.console.customer import add_customer_routes
from gateway.console.operators import PREFIX as OPERATORS_PREFIX
from gateway.console.operators import add_operator_routes
from gateway.console.rendering import Pages, add_static_routes
from gateway.console.sessions import SessionStore

#: Where each console keeps its sessions in Redis (apart: one's session is not the other's).
CUSTOMER_SESSIONS = "cstack:console:session:"


def add_console_routes(
    app: Starlette,
    auth: Authenticator,
    store: KeyStore,
    usage: UsageReader,
    accounts: BillingAccounts,
    redis: Redis,
) -> None:
    pages = Pages()
    add_static_routes(app, PREFIX)
    access = Access(auth, store, usage, SessionStore(redis, CUSTOMER_SESSIONS), pages)
    add_customer_routes(app, access)
    add_static_routes(app, OPERATORS_PREFIX)
    add_operator_routes(app, auth, store, usage, accounts, redis, pages)
