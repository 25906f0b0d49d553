"""Who is looking at a customer console page: sign-in with an API key, sign-out, and the
check every page makes that its session's key and org still stand.

The key is checked once, at sign-in, by the gateway's Authenticator. Afterwards each page
reads the key's and the org's records from the KeyStore (uncached: the records the
Authenticator's cache is a copy of) and the org's suspension from billing, so a revoked
key, a deleted org or a suspended org loses its session on its next page.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from redis.exceptions import RedisError
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from billing.contract import UsageReader, UsageUnavailable
from gateway.access.auth import Authenticator
from gateway.access.keys import KeyStore, Org
from gateway.console.rendering import Pages
from gateway.console.sessions import CookieJar, Session, SessionStore, same_token, set_cookie
from gateway.errors import GatewayError

logger = logging.getLogger(__name__)

PREFIX = "/console"
COOKIES = CookieJar(session="cstack_console", sign_in_csrf="cstack_console_sign_in", path=PREFIX)
#: A sign-in form is good for this long (its CSRF cookie's lifetime).
SIGN_IN_FORM_TTL_S = 3600
#: Longer form fields are refused before they are read any further.
MAX_FIELD_LENGTH = 500


@dataclass(frozen=True)
class Viewer:
    """A signed-in page view: the session, its org's record and its billing account."""

    session: Session
    org: Org
    account: dict[str, Any]


Handler = Callable[[Request, Viewer], Awaitable[Response]]


def to_sign_in(message: str = "") -> RedirectResponse:
    # 303: the browser follows with a GET whatever the method was.
    target = f"{PREFIX}/sign-in" + ("?reason=" + message if message else "")
    return RedirectResponse(target, status_code=303)


class Access:
    def __init__(
        self,
        auth: Authenticator,
        store: KeyStore,
        usage: UsageReader,
        sessions: SessionStore,
        pages: Pages,
    ) -> None:
        self.auth = auth
        self.store = store
        self.usage = usage
        self.sessions = sessions
        self.pages = pages

    def unavailable(self, what: str) -> Response:
        return self.pages.render(
            "error.jinja",
            {"title": "Temporarily unavailable", "message": f"{what} Retry shortly."},
            503,
        )

    async def sign_in_form(self, request: Request, reason: str = "", status: int = 200) -> Response:
        token = secrets.token_urlsafe(32)
        response = self.pages.render(
            "sign_in.jinja",
            {
                "form_csrf": token,
                "reason": reason,
                "prefix": PREFIX,
                "field": "api_key",
                "field_label": "API key",
                "field_help": "One of your organization's keys (sk-cs-…).",
            },
            status,
        )
        set_cookie(response, request, COOKIES.sign_in_csrf, token, PREFIX, SIGN_IN_FORM_TTL_S)
        return response

    async def sign_in(self, request: Request) -> Response:
        form = await request.form(max_files=0, max_fields=10)
        csrf, key = form.get("csrf_token"), form.get("api_key")
        if not isinstance(csrf, str) or not same_token(
            csrf, request.cookies.get(COOKIES.sign_in_csrf, "")
        ):
            return self.refused()
        if not isinstance(key, str) or not key.strip() or len(key) > MAX_FIELD_LENGTH:
            return await self.sign_in_form(request, "Enter an API key.", 400)
        try:
            principal = await self.auth.authenticate(f"Bearer {key.strip()}")
            org = await self.store.get_org(principal.key.org_id)
            if org is None:
                return await self.sign_in_form(request, "This key's organization is gone.", 401)
            account = await self.usage.account(org.org_id, org.plan)
        except GatewayError as exc:
            if exc.status_code == 401:
                return await self.sign_in_form(
                    request, "Incorrect, unknown or revoked API key.", 401
                )
            return self.unavailable("Sign-in is unavailable.")
        except (RedisError, OSError, UsageUnavailable):
            return self.unavailable("Sign-in is unavailable.")
        if account["suspended"]:
            return await self.sign_in_form(request, "This organization is suspended.", 403)
        try:
            session_id, _ = await self.sessions.create(principal.key.key_id, org.org_id)
        except (RedisError, OSError):
            return self.unavailable("Sign-in is unavailable.")
        logger.info("console sign-in: org %s, key %s", org.org_id, principal.key.key_id)
        response = RedirectResponse(f"{PREFIX}/overview", status_code=303)
        set_cookie(response, request, COOKIES.session, session_id, PREFIX, self.sessions.ttl_s)
        response.delete_cookie(COOKIES.sign_in_csrf, path=PREFIX)
        return response

    async def sign_out(self, request: Request) -> Response:
        session_id = request.cookies.get(COOKIES.session)
        session = await self.sessions.get(session_id)
        if session is None:
            return to_sign_in()
        form = await request.form(max_files=0, max_fields=10)
        csrf = form.get("csrf_token")
        if not isinstance(csrf, str) or not same_token(csrf, session.csrf):
            return self.refused()
        await self.sessions.delete(session_id)
        response = to_sign_in("signed-out")
        response.delete_cookie(COOKIES.session, path=PREFIX)
        return response

    def refused(self) -> Response:
        return self.pages.render(
            "error.jinja",
            {
                "title": "Form refused",
                "message": "The form's security token is missing or stale: reload the page "
                "and send it again.",
            },
            403,
        )

    async def viewer(self, request: Request) -> Viewer | Response:
        """The signed-in view, or where to go instead (sign-in, or an error page)."""
        session_id = request.cookies.get(COOKIES.session)
        try:
            session = await self.sessions.get(session_id)
            if session is None:
                return to_sign_in()
            key = await self.store.get_key(session.key_id)
            org = await self.store.get_org(session.org_id)
            if key is None or key.revoked_at is not None or key.org_id != session.org_id:
                await self.sessions.delete(session_id)
                return to_sign_in("revoked")
            if org is None:
                await self.sessions.delete(session_id)
                return to_sign_in("revoked")
            account = await self.usage.account(org.org_id, org.plan)
        except (RedisError, OSError):
            return self.unavailable("The console is unavailable.")
        except UsageUnavailable as exc:
            logger.warning("console: usage unavailable: %s", exc)
            return self.unavailable("Usage data is unavailable.")
        if account["suspended"]:
            await self.sessions.delete(session_id)
            return to_sign_in("suspended")
        return Viewer(session, org, account)

    def page(self, handler: Handler) -> Callable[[Request], Awaitable[Response]]:
        """A route that only a signed-in viewer sees (others go to sign-in)."""

        async def route(request: Request) -> Response:
            viewer = await self.viewer(request)
            if isinstance(viewer, Response):
                return viewer
            try:
                return await handler(request, viewer)
            except UsageUnavailable as exc:
                logger.warning("console: usage unavailable: %s", exc)
                return self.unavailable("Usage data is unavailable.")

        return route
