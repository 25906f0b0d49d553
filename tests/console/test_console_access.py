"""Who may see what on the customer console, over HTTP against the live gateway: forms
without their CSRF token are refused, an org sees only its own data, a revoked key or a
suspended org loses its session at its next page, sign-out ends a session, the cookie is
Secure behind https, and the charts' JavaScript is the plotly wheel's own file."""

from __future__ import annotations

import asyncio
import re
from datetime import UTC, datetime
from time import time_ns

import httpx
from sqlalchemy import insert

from billing.ledger import OrgSuspension
from gateway.console.rendering import plotly_js
from tests.support.console import ADMIN_TOKEN, Console, Org, make_org

CSRF_FIELD = re.compile(r'name="csrf_token" value="([^"]+)"')


def csrf_of(page: httpx.Response) -> str:
    found = CSRF_FIELD.search(page.text)
    assert found, page.text
    return found.group(1)


def signed_in(console: Console, org: Org, **headers: str) -> httpx.Client:
    """A client holding a console session of ``org`` (signed in through the form)."""
    client = httpx.Client(base_url=console.gateway.url, timeout=30, headers=headers)
    form = client.get("/console/sign-in")
    answer = client.post("/console/sign-in", data={"csrf_token": csrf_of(form), "api_key": org.key})
    assert answer.status_code == 303, answer.text
    assert answer.headers["location"] == "/console/overview"
    return client


def test_sign_in_without_its_csrf_token_is_refused(console: Console) -> None:
    client = httpx.Client(base_url=console.gateway.url, timeout=30)
    client.get("/console/sign-in")  # the form's cookie, but not its token
    refused = client.post("/console/sign-in", data={"api_key": console.a.key})
    assert refused.status_code == 403
    assert "cstack_console" not in client.cookies
    forged = client.post(
        "/console/sign-in", data={"csrf_token": "x" * 43, "api_key": console.a.key}
    )
    assert forged.status_code == 403


def test_a_wrong_key_is_refused_and_not_echoed(console: Console) -> None:
    client = httpx.Client(base_url=console.gateway.url, timeout=30)
    wrong = f"sk-cs-{console.a.key_id}.not-the-secret"
    answer = client.post(
        "/console/sign-in",
        data={"csrf_token": csrf_of(client.get("/console/sign-in")), "api_key": wrong},
    )
    assert answer.status_code == 401
    assert "Incorrect, unknown or revoked API key." in answer.text
    assert wrong not in answer.text and "not-the-secret" not in answer.text


def test_sign_out_needs_the_sessions_csrf_token_and_ends_the_session(console: Console) -> None:
    client = signed_in(console, console.a)
    overview = client.get("/console/overview")
    assert overview.status_code == 200
    assert overview.headers["cache-control"] == "no-store"
    assert client.post("/console/sign-out", data={}).status_code == 403
    assert client.post("/console/sign-out", data={"csrf_token": "forged"}).status_code == 403
    assert client.get("/console/overview").status_code == 200  # still signed in
    out = client.post("/console/sign-out", data={"csrf_token": csrf_of(overview)})
    assert out.status_code == 303 and "signed-out" in out.headers["location"]
    after = client.get("/console/overview")
    assert after.status_code == 303 and after.headers["location"].startswith("/console/sign-in")


def test_an_org_sees_only_its_own_data(console: Console) -> None:
    a, b = signed_in(console, console.a), signed_in(console, console.b)
    b_receipt = f"req_{console.b.org_id}_0000"
    assert b.get(f"/console/receipts/{b_receipt}").status_code == 200
    assert a.get(f"/console/receipts/{b_receipt}").status_code == 404
    a_receipt = f"req_{console.a.org_id}_0000"
    assert b.get(f"/console/receipts/{a_receipt}").status_code == 404
    for page in ("overview", "usage", "receipts?limit=100", "invoice", "keys"):
        seen_by_a, seen_by_b = a.get(f"/console/{page}").text, b.get(f"/console/{page}").text
        assert console.b.org_id not in seen_by_a and console.b.key_id not in seen_by_a
        assert console.a.org_id not in seen_by_b and console.a.key_id not in seen_by_b
    # Filtering by the other org's key finds nothing either.
    other = a.get("/console/receipts", params={"key_id": console.b.key_id})
    assert "No receipts match." in other.text
    month = datetime.now(UTC).strftime("%Y-%m")
    csv_b = b.get("/console/receipts.csv", params={"month": month}).text
    assert console.a.org_id not in csv_b and csv_b.count("\n") == 3


def test_a_revoked_key_loses_its_session(console: Console) -> None:
    org = asyncio.run(make_org(console.gateway.settings.redis_url, f"org-r-{time_ns()}", "pro"))
    client = signed_in(console, org)
    assert client.get("/console/keys").status_code == 200
    revoked = httpx.post(
        f"{console.gateway.internal_url}/admin/keys/{org.key_id}/revoke",
        headers={"authorization": f"Bearer {ADMIN_TOKEN}"},
    )
    assert revoked.status_code == 200, revoked.text
    gone = client.get("/console/keys")
    assert gone.status_code == 303 and gone.headers["location"].endswith("reason=revoked")
    # The session is deleted, not only refused: signing in again needs a live key.
    assert client.get("/console/overview").headers["location"] == "/console/sign-in"


def test_a_suspended_org_loses_its_session_and_cannot_sign_in(console: Console) -> None:
    org = asyncio.run(make_org(console.gateway.settings.redis_url, f"org-s-{time_ns()}", "pro"))
    client = signed_in(console, org)
    assert client.get("/console/overview").status_code == 200
    with console.engine.begin() as connection:  # as Stripe's payment_failed webhook records it
        connection.execute(
            insert(OrgSuspension).values(
                org_id=org.org_id,
                customer_id=None,
                suspended=True,
                reason="invoice.payment_failed",
                updated_at=datetime.now(UTC),
            )
        )
    gone = client.get("/console/overview")
    assert gone.status_code == 303 and gone.headers["location"].endswith("reason=suspended")
    again = httpx.Client(base_url=console.gateway.url, timeout=30)
    refused = again.post(
        "/console/sign-in",
        data={"csrf_token": csrf_of(again.get("/console/sign-in")), "api_key": org.key},
    )
    assert refused.status_code == 403 and "suspended" in refused.text


def test_behind_https_the_session_cookie_is_secure(console: Console) -> None:
    client = httpx.Client(
        base_url=console.gateway.url, timeout=30, headers={"x-forwarded-proto": "https"}
    )
    form = client.get("/console/sign-in")
    assert "secure" in form.headers["set-cookie"].lower()
    # httpx keeps a Secure cookie from plain http: the proxy's https leg is not here.
    answer = client.post(
        "/console/sign-in",
        data={"csrf_token": csrf_of(form), "api_key": console.a.key},
        headers={"cookie": f"cstack_console_sign_in={form.cookies['cstack_console_sign_in']}"},
    )
    assert answer.status_code == 303, answer.text
    cookie = answer.headers["set-cookie"].lower()
    assert "secure" in cookie and "httponly" in cookie and "samesite=strict" in cookie
    assert "path=/console" in cookie and "max-age=" in cookie


def test_the_console_is_on_the_public_listener_only(console: Console) -> None:
    assert httpx.get(f"{console.gateway.internal_url}/console/sign-in").status_code == 404
    assert httpx.get(f"{console.gateway.url}/console/sign-in").status_code == 200


def test_plotly_js_is_served_from_the_wheel(console: Console) -> None:
    served = httpx.get(f"{console.gateway.url}/console/static/plotly.min.js", timeout=30)
    assert served.status_code == 200
    assert served.content == plotly_js().read_bytes()
    assert httpx.get(f"{console.gateway.url}/console/static/other.js").status_code == 404
