"""The operators' console on the internal listener, in headless Chromium: sign-in with the
admin token, every org with its settings, a key created (shown once, and it works) and
revoked, an org's default tier and Stripe customer changed as the admin API changes
them, and the tiers' live figures; its forms refuse a missing CSRF token."""

from __future__ import annotations

import asyncio
import re
from time import time_ns

import httpx
from selenium import webdriver
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions
from selenium.webdriver.support.ui import WebDriverWait

from serving.vocabulary import TIERS
from tests.support.console import ADMIN_TOKEN, Console, make_org, navigate


def sign_in(driver: webdriver.Chrome, console: Console) -> None:
    driver.delete_all_cookies()
    driver.get(f"{console.gateway.internal_url}/admin/console")
    field = driver.find_element(By.ID, "admin_token")
    field.send_keys(ADMIN_TOKEN)
    field.submit()
    WebDriverWait(driver, 20).until(expected_conditions.url_contains("/admin/console/orgs"))


def admin_org(console: Console, org_id: str) -> dict[str, object]:
    answer = httpx.get(
        f"{console.gateway.internal_url}/admin/orgs/{org_id}",
        headers={"authorization": f"Bearer {ADMIN_TOKEN}"},
    )
    assert answer.status_code == 200, answer.text
    return dict(answer.json())


def test_operators_manage_orgs_and_keys(console: Console, browser: webdriver.Chrome) -> None:
    org = asyncio.run(make_org(console.gateway.settings.redis_url, f"org-op-{time_ns()}", "pro"))
    sign_in(browser, console)
    table = browser.find_element(By.ID, "orgs-table").text
    assert org.org_id in table and console.a.org_id in table
    assert "$100.000000000 + $1000.000000000" in table  # pro's budget
    browser.save_screenshot(str(console.screenshots / "operator-orgs.png"))

    navigate(browser, browser.find_element(By.LINK_TEXT, org.org_id))
    browser.find_element(By.ID, "key_name").send_keys("made in the console")
    navigate(browser, browser.find_element(By.ID, "create-key"))
    token = browser.find_element(By.ID, "new-key").text
    models = httpx.get(
        f"{console.gateway.url}/v1/models", headers={"authorization": f"Bearer {token}"}
    )
    assert models.status_code == 200, models.text

    browser.find_element(By.ID, "default_tier").send_keys("standard")
    customer = browser.find_element(By.ID, "customer_id")
    customer.clear()
    customer.send_keys("cus_console1")
    navigate(browser, browser.find_element(By.ID, "save-settings"))
    WebDriverWait(browser, 20).until(lambda d: "new-key" not in d.page_source)
    record = admin_org(console, org.org_id)
    assert (record["default_tier"], record["customer_id"]) == ("standard", "cus_console1")

    key_id = token.removeprefix("sk-cs-").split(".")[0]
    navigate(
        browser, browser.find_element(By.CSS_SELECTOR, f"button[aria-label='Revoke key {key_id}']")
    )
    WebDriverWait(browser, 20).until(
        lambda d: "revoked" in d.find_element(By.ID, "keys-table").text
    )
    browser.save_screenshot(str(console.screenshots / "operator-org.png"))
    gone = httpx.get(
        f"{console.gateway.url}/v1/models", headers={"authorization": f"Bearer {token}"}
    )
    assert gone.status_code == 401


def test_tiers_page_shows_each_tiers_figures(console: Console, browser: webdriver.Chrome) -> None:
    sign_in(browser, console)
    browser.get(f"{console.gateway.internal_url}/admin/console/tiers")
    rows = browser.find_elements(By.CSS_SELECTOR, "#tiers-table tbody tr")
    assert [row.find_element(By.TAG_NAME, "th").text for row in rows] == list(TIERS)
    browser.save_screenshot(str(console.screenshots / "operator-tiers.png"))


def test_operator_forms_need_their_csrf_token(console: Console) -> None:
    client = httpx.Client(base_url=console.gateway.internal_url, timeout=30)
    form = client.get("/admin/console/sign-in")
    csrf = re.search(r'name="csrf_token" value="([^"]+)"', form.text)
    assert csrf
    assert (
        client.post("/admin/console/sign-in", data={"admin_token": ADMIN_TOKEN}).status_code == 403
    )
    wrong = client.post(
        "/admin/console/sign-in", data={"csrf_token": csrf.group(1), "admin_token": "wrong"}
    )
    assert wrong.status_code == 401
    form = client.get("/admin/console/sign-in")
    csrf = re.search(r'name="csrf_token" value="([^"]+)"', form.text)
    assert csrf
    signed = client.post(
        "/admin/console/sign-in", data={"csrf_token": csrf.group(1), "admin_token": ADMIN_TOKEN}
    )
    assert signed.status_code == 303, signed.text
    refused = client.post(f"/admin/console/orgs/{console.a.org_id}/keys", data={"name": "x"})
    assert refused.status_code == 403
    assert client.post(f"/admin/console/keys/{console.a.key_id}/revoke").status_code == 403
    assert admin_org(console, console.a.org_id)["org_id"] == console.a.org_id


def test_operator_console_is_internal_and_needs_its_own_session(
    console: Console,
) -> None:
    assert httpx.get(f"{console.gateway.url}/admin/console/sign-in").status_code == 404
    # A customer's session cookie is not an operator's.
    customer = httpx.Client(base_url=console.gateway.url, timeout=30)
    form = customer.get("/console/sign-in")
    csrf = re.search(r'name="csrf_token" value="([^"]+)"', form.text)
    assert csrf
    customer.post("/console/sign-in", data={"csrf_token": csrf.group(1), "api_key": console.a.key})
    session = customer.cookies["cstack_console"]
    probe = httpx.get(
        f"{console.gateway.internal_url}/admin/console/orgs",
        cookies={"cstack_admin_console": session},
    )
    assert probe.status_code == 303 and probe.headers["location"].endswith("/sign-in")
