"""The operators' console under ``/admin/console`` on the internal listener.

Signed in with the admin token (``CSTACK_ADMIN_TOKEN``, as the admin API): every org with
its plan, default tier, overflow, budget, suspension and Stripe customer; an org's keys
to create and revoke, its default tier, overflow and Stripe customer to change; and per
tier the live requests, time to first token and errors from the gateway's own metrics.
Each change goes where the admin API sends it (KeyStore, billing's accounts) and every
form carries its session's CSRF token. A session ends when the admin token changes.
"""

from __future__ import annotations

import hashlib
import logging
import secrets
from collections.abc import Awaitable, Callable
from typing import Any

from prometheus_client.parser import text_string_to_metric_families
from redis.asyncio import Redis
from redis.exceptions import RedisError
from starlette.applications import Starlette
from starlette.datastructures import FormData
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from billing.contract import (
    AccountsUnavailable,
    BillingAccounts,
    UsageReader,
    UsageUnavailable,
    check_customer_id,
)
from gateway.access.auth import Authenticator
from gateway.access.keys import ORGS_KEY, KeyStore, KeyStoreError
from gateway.console.rendering import Pages
from gateway.console.sessions import Session, SessionStore, same_token, set_cookie
from gateway.metrics import GatewayMetrics
from serving.vocabulary import TIERS

logger = logging.getLogger(__name__)

PREFIX = "/admin/console"
SESSION_COOKIE = "cstack_admin_console"
SIGN_IN_COOKIE = "cstack_admin_console_sign_in"
SESSIONS = "cstack:console:admin-session:"
NAV = [("orgs", "Organizations"), ("tiers", "Tiers")]
MAX_FIELD_LENGTH = 500

OperatorHandler = Callable[[Request, Session], Awaitable[Response]]


def token_id(token: str) -> str:
    """What a session remembers of the admin token it was opened with (not the token)."""
    return hashlib.sha256(token.encode()).hexdigest()[:32]


def admin_token(request: Request) -> str | None:
    secret = request.app.state.settings.admin_token
    return secret.get_secret_value() if secret is not None and secret.get_secret_value() else None


def tier_figures(metrics: GatewayMetrics) -> list[dict[str, Any]]:
    """Per tier: requests in flight, requests answered and with 5xx, upstream errors, and
    the mean time to first token, from what ``/metrics`` exposes (all workers')."""
    figures: dict[str, dict[str, float]] = {
        tier: dict.fromkeys(
            ("inflight", "requests", "errors_5xx", "upstream_errors", "ttft_sum", "ttft_count"), 0.0
        )
        for tier in TIERS
    }
    for family in text_string_to_metric_families(metrics.render().decode()):
        for sample in family.samples:
            tier = sample.labels.get("tier")
            if tier not in figures:
                continue
            row = figures[tier]
            if sample.name == "cstack_inflight_requests":
                row["inflight"] += sample.value
            elif sample.name == "cstack_requests_total":
                row["requests"] += sample.value
                if sample.labels.get("status", "").startswith("5"):
                    row["errors_5xx"] += sample.value
            elif sample.name == "cstack_upstream_errors_total":
                row["upstream_errors"] += sample.value
            elif sample.name == "cstack_time_to_first_token_seconds_sum":
                row["ttft_sum"] += sample.value
            elif sample.name == "cstack_time_to_first_token_seconds_count":
                row["ttft_count"] += sample.value
    return [
        {
            "tier": tier,
            "inflight": int(row["inflight"]),
            "requests": int(row["requests"]),
            "errors_5xx": int(row["errors_5xx"]),
            "upstream_errors": int(row["upstream_errors"]),
            "ttft_mean_ms": round(1000 * row["ttft_sum"] / row["ttft_count"], 1)
            if row["ttft_count"]
            else None,
        }
        for tier, row in figures.items()
    ]


def add_operator_routes(
    app: Starlette,
    auth: Authenticator,
    store: KeyStore,
    usage: UsageReader,
    accounts: BillingAccounts,
    redis: Redis,
    pages: Pages,
) -> None:
    sessions = SessionStore(redis, SESSIONS)

    def render(name: str, session: Session | None, status: int = 200, **context: Any) -> Response:
        return pages.render(
            name,
            {
                "prefix": PREFIX,
                "nav": NAV,
                "brand": "operators' console",
                "csrf": session.csrf if session else None,
                **context,
            },
            status,
        )

    def refused(session: Session | None) -> Response:
        return render(
            "error.jinja",
            session,
            403,
            title="Form refused",
            message="The form's security token is missing or stale: reload the page.",
        )

    async def sign_in_page(request: Request, reason: str = "", status: int = 200) -> Response:
        token = secrets.token_urlsafe(32)
        response = render(
            "sign_in.jinja",
            None,
            status,
            form_csrf=token,
            reason=reason,
            field="admin_token",
            field_label="Admin token",
            field_help="The gateway's CSTACK_ADMIN_TOKEN.",
        )
        set_cookie(response, request, SIGN_IN_COOKIE, token, PREFIX, 3600)
        return response

    async def sign_in(request: Request) -> Response:
        form = await request.form(max_files=0, max_fields=10)
        sent = form.get("admin_token")
        if not same_token(
            str(form.get("csrf_token") or ""), request.cookies.get(SIGN_IN_COOKIE, "")
        ):
            return refused(None)
        expected = admin_token(request)
        if expected is None:
            return await sign_in_page(
                request, "The admin API is disabled: set CSTACK_ADMIN_TOKEN.", 403
            )
        if (
            not isinstance(sent, str)
            or len(sent) > MAX_FIELD_LENGTH
            or not same_token(sent, expected)
        ):
            return await sign_in_page(request, "Incorrect admin token.", 401)
        session_id, _ = await sessions.create(token_id(expected), "")
        logger.info("operators' console sign-in")
        response = RedirectResponse(f"{PREFIX}/orgs", status_code=303)
        set_cookie(response, request, SESSION_COOKIE, session_id, PREFIX, sessions.ttl_s)
        response.delete_cookie(SIGN_IN_COOKIE, path=PREFIX)
        return response

    async def current(request: Request) -> Session | None:
        session = await sessions.get(request.cookies.get(SESSION_COOKIE))
        expected = admin_token(request)
        if session is None or expected is None or session.key_id != token_id(expected):
            return None
        return session

    def page(
        handler: OperatorHandler, *, form: bool = False
    ) -> Callable[[Request], Awaitable[Response]]:
        async def route(request: Request) -> Response:
            try:
                session = await current(request)
                if session is None:
                    return RedirectResponse(f"{PREFIX}/sign-in", status_code=303)
                if form:
                    fields = await request.form(max_files=0, max_fields=20)
                    if not same_token(str(fields.get("csrf_token") or ""), session.csrf):
                        return refused(session)
                    request.state.form = fields
                return await handler(request, session)
            except (RedisError, OSError, UsageUnavailable, AccountsUnavailable) as exc:
                logger.warning("operators' console: %s", type(exc).__name__)
                return render(
                    "error.jinja",
                    None,
                    503,
                    title="Temporarily unavailable",
                    message="Redis or the ledger did not answer; retry shortly.",
                )

        return route

    async def sign_out(request: Request, session: Session) -> Response:
        await sessions.delete(request.cookies.get(SESSION_COOKIE))
        response = RedirectResponse(f"{PREFIX}/sign-in", status_code=303)
        response.delete_cookie(SESSION_COOKIE, path=PREFIX)
        return response

    async def orgs_page(request: Request, session: Session) -> Response:
        org_ids = sorted(member.decode() for member in await redis.smembers(ORGS_KEY))
        rows = []
        for org_id in org_ids:
            org = await store.get_org(org_id)
            if org is not None:
                rows.append({"org": org, "account": await usage.account(org_id, org.plan)})
        return render("operator_orgs.jinja", session, page="orgs", rows=rows)

    async def org_page(request: Request, session: Session, **context: Any) -> Response:
        org = await store.get_org(request.path_params["org_id"])
        if org is None:
            return render("error.jinja", session, 404, title="Not found", message="No such org.")
        return render(
            "operator_org.jinja",
            session,
            page="orgs",
            subject=org,
            account=await usage.account(org.org_id, org.plan),
            keys=await store.list_keys(org.org_id),
            tiers=TIERS,
            **context,
        )

    async def create_key(request: Request, session: Session) -> Response:
        fields: FormData = request.state.form
        name = str(fields.get("name") or "")[:200]
        try:
            token, record = await store.create_key(request.path_params["org_id"], name=name)
        except KeyStoreError as exc:
            return render("error.jinja", session, 400, title="Refused", message=str(exc))
        logger.info("operators' console: key %s created", record.key_id)
        return await org_page(request, session, new_key=token)

    async def revoke_key(request: Request, session: Session) -> Response:
        key = await store.get_key(request.path_params["key_id"])
        if key is None:
            return render("error.jinja", session, 404, title="Not found", message="No such key.")
        await store.revoke_key(key.key_id)
        auth.invalidate()
        return RedirectResponse(f"{PREFIX}/orgs/{key.org_id}", status_code=303)

    async def update_org(request: Request, session: Session) -> Response:
        fields: FormData = request.state.form
        org_id = request.path_params["org_id"]
        tier = str(fields.get("default_tier") or "")
        customer = str(fields.get("customer_id") or "").strip()
        if tier not in TIERS:
            return render("error.jinja", session, 400, title="Refused", message="Unknown tier.")
        if customer:
            try:
                check_customer_id(customer)
            except ValueError as exc:
                return render("error.jinja", session, 400, title="Refused", message=str(exc))
        org = await store.get_org(org_id)
        if org is None:
            return render("error.jinja", session, 404, title="Not found", message="No such org.")
        if customer != org.customer_id:
            # Billing's record first, as the admin API does: invoices go by it.
            await accounts.set_customer(org_id, customer or None)
        await store.update_org(
            org_id,
            default_tier=tier,  # type: ignore[arg-type]
            fast_overflow=fields.get("fast_overflow") == "on",
            customer_id=customer,
        )
        auth.invalidate()
        return RedirectResponse(f"{PREFIX}/orgs/{org_id}", status_code=303)

    async def tiers_page(request: Request, session: Session) -> Response:
        figures = tier_figures(request.app.state.metrics)
        return render("operator_tiers.jinja", session, page="tiers", figures=figures)

    async def home(request: Request) -> Response:
        return RedirectResponse(f"{PREFIX}/orgs", status_code=303)

    app.add_route(PREFIX, home, methods=["GET"])
    app.add_route(f"{PREFIX}/sign-in", sign_in_page, methods=["GET"])
    app.add_route(f"{PREFIX}/sign-in", sign_in, methods=["POST"])
    app.add_route(f"{PREFIX}/sign-out", page(sign_out, form=True), methods=["POST"])
    app.add_route(f"{PREFIX}/orgs", page(orgs_page), methods=["GET"])
    app.add_route(f"{PREFIX}/orgs/{{org_id}}", page(org_page), methods=["GET"])
    app.add_route(f"{PREFIX}/orgs/{{org_id}}", page(update_org, form=True), methods=["POST"])
    app.add_route(f"{PREFIX}/orgs/{{org_id}}/keys", page(create_key, form=True), methods=["POST"])
    app.add_route(f"{PREFIX}/keys/{{key_id}}/revoke", page(revoke_key, form=True), methods=["POST"])
    app.add_route(f"{PREFIX}/tiers", page(tiers_page), methods=["GET"])
