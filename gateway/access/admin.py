"""``/admin/``: orgs (their plan, tier settings and Stripe customer) and API keys, behind
their own bearer token (``CSTACK_ADMIN_TOKEN``).

With no admin token configured the whole API answers 403: an operator must opt in, so a
gateway started without one never has an open key-minting endpoint.
"""

from __future__ import annotations

import hmac
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, StrictBool

from billing.contract import AccountsUnavailable, BillingAccounts, check_customer_id
from gateway.access.auth import Authenticator
from gateway.access.keys import KeyStore, KeyStoreError
from gateway.errors import GatewayError
from serving.vocabulary import DEFAULT_TIER, Tier


class CreateOrg(BaseModel):
    model_config = ConfigDict(extra="forbid")

    org_id: Annotated[str, Field(min_length=1, max_length=64)]
    name: Annotated[str, Field(max_length=200)] = ""
    plan: Annotated[str, Field(max_length=64)] = ""
    #: The billing provider's customer id (Stripe ``cus_...``), if any.
    customer_id: Annotated[str, Field(max_length=200)] = ""
    #: The tier of requests without ``service_tier`` (or with "auto").
    default_tier: Tier = DEFAULT_TIER
    #: Whether fast requests may overflow to the standard pool (billed as standard).
    fast_overflow: StrictBool = False


class UpdateOrg(BaseModel):
    """The org settings to change; those left out keep their value."""

    model_config = ConfigDict(extra="forbid")

    default_tier: Tier | None = None
    fast_overflow: StrictBool | None = None
    #: Its Stripe customer from now on (every item of its months goes there); "" removes it.
    customer_id: Annotated[str, Field(max_length=200)] | None = None


class CreateKey(BaseModel):
    model_config = ConfigDict(extra="forbid")

    plan: Annotated[str, Field(max_length=64)] = ""
    name: Annotated[str, Field(max_length=200)] = ""


def require_admin(request: Request) -> None:
    expected = request.app.state.settings.admin_token
    if expected is None or not expected.get_secret_value():
        raise GatewayError(
            403,
            "admin API disabled: set CSTACK_ADMIN_TOKEN",
            type="permission_error",
            code="admin_disabled",
        )
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(
        token.strip().encode(), expected.get_secret_value().encode()
    ):
        raise GatewayError(401, "invalid admin token", code="invalid_admin_token")


def store_error(exc: KeyStoreError) -> GatewayError:
    message = str(exc)
    if message.startswith("unknown"):
        return GatewayError(404, message, code="not_found")
    if "already exists" in message:
        return GatewayError(409, message, code="conflict")
    return GatewayError(400, message, code="invalid_value")


def customer_error(exc: ValueError) -> GatewayError:
    return GatewayError(400, str(exc), param="customer_id", code="invalid_value")


def accounts_unavailable(done: str) -> GatewayError:
    return GatewayError(
        503,
        f"{done}, but billing could not record its Stripe customer; send the change again",
        type="server_error",
        code="billing_unavailable",
    )


def build_admin_router(
    store: KeyStore, auth: Authenticator, accounts: BillingAccounts
) -> APIRouter:
    router = APIRouter(prefix="/admin", dependencies=[Depends(require_admin)])

    @router.post("/orgs", status_code=201)
    async def create_org(body: CreateOrg) -> dict[str, Any]:
        if body.customer_id:
            try:
                check_customer_id(body.customer_id)
            except ValueError as exc:
                raise customer_error(exc) from None
        try:
            org = await store.create_org(
                body.org_id,
                body.name,
                body.plan,
                body.customer_id,
                body.default_tier,
                body.fast_overflow,
            )
        except KeyStoreError as exc:
            raise store_error(exc) from None
        if body.customer_id:
            try:
                await accounts.set_customer(org.org_id, body.customer_id)
            except AccountsUnavailable:
                raise accounts_unavailable(f"org {org.org_id!r} was created") from None
        return {"object": "organization", **org.__dict__}

    @router.get("/orgs/{org_id}")
    async def get_org(org_id: str) -> dict[str, Any]:
        org = await store.get_org(org_id)
        if org is None:
            raise GatewayError(404, f"unknown org {org_id!r}", code="not_found")
        return {"object": "organization", **org.__dict__}

    @router.patch("/orgs/{org_id}")
    async def update_org(org_id: str, body: UpdateOrg) -> dict[str, Any]:
        if body.customer_id is not None:
            # Billing's record first: it is what invoices go by. Redis's copy (admission's
            # suspension check) follows; a failure between the two is retried by the admin.
            if await store.get_org(org_id) is None:
                raise GatewayError(404, f"unknown org {org_id!r}", code="not_found")
            try:
                await accounts.set_customer(org_id, body.customer_id or None)
            except ValueError as exc:
                raise customer_error(exc) from None
            except AccountsUnavailable:
                raise accounts_unavailable(f"org {org_id!r} was not changed") from None
        try:
            org = await store.update_org(
                org_id,
                default_tier=body.default_tier,
                fast_overflow=body.fast_overflow,
                customer_id=body.customer_id,
            )
        except KeyStoreError as exc:
            raise store_error(exc) from None
        auth.invalidate()  # this replica at once; the others at their next epoch poll
        return {"object": "organization", **org.__dict__}

    @router.post("/orgs/{org_id}/keys", status_code=201)
    async def create_key(org_id: str, body: CreateKey | None = None) -> JSONResponse:
        body = body or CreateKey()
        try:
            token, record = await store.create_key(org_id, body.plan, body.name)
        except KeyStoreError as exc:
            raise store_error(exc) from None
        # The only time the plaintext key exists outside the client: never cache it.
        return JSONResponse(
            {"object": "api_key", "key": token, **record.public()},
            status_code=201,
            headers={"cache-control": "no-store"},
        )

    @router.get("/orgs/{org_id}/keys")
    async def list_keys(org_id: str) -> dict[str, Any]:
        if await store.get_org(org_id) is None:
            raise GatewayError(404, f"unknown org {org_id!r}", code="not_found")
        keys = await store.list_keys(org_id)
        return {"object": "list", "data": [{"object": "api_key", **k.public()} for k in keys]}

    @router.post("/keys/{key_id}/revoke")
    async def revoke_key(key_id: str) -> dict[str, Any]:
        try:
            record = await store.revoke_key(key_id)
        except KeyStoreError as exc:
            raise store_error(exc) from None
        auth.invalidate()
        return {"object": "api_key", **record.public()}

    return router
