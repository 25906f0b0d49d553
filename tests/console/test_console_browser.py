"""The customer console in headless Chromium against a live gateway (real Valkey, a real
ledger): sign-in with the keyboard only, and each page's figures equal what the API
answers for the same org (``/v1/usage``, its receipts and CSV, and the invoice preview
`cstack billing invoice-preview` prints). Each page is screenshotted to the test's tmp dir.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
from selenium import webdriver
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support import expected_conditions
from selenium.webdriver.support.ui import WebDriverWait

from billing.ledger.invoice import invoice_preview
from billing.prices.money import format_cents, format_nano_usd
from tests.support.console import RECEIPTS_A, Console, Org, navigate

pytestmark = pytest.mark.timeout(300)


def api(console: Console, org: Org) -> httpx.Client:
    return httpx.Client(
        base_url=console.gateway.url,
        headers={"authorization": f"Bearer {org.key}"},
        timeout=30,
    )


def text_of(driver: webdriver.Chrome, element_id: str) -> str:
    return str(driver.find_element(By.ID, element_id).text)


def sign_in_by_keyboard(driver: webdriver.Chrome, console: Console, org: Org) -> None:
    """Sign in as a keyboard user does: Tab to the key field, type, Enter."""
    driver.delete_all_cookies()
    driver.get(f"{console.gateway.url}/console")
    assert driver.current_url.endswith("/console/sign-in")
    body = driver.find_element(By.TAG_NAME, "body")
    body.send_keys(Keys.TAB)  # the skip link
    driver.switch_to.active_element.send_keys(Keys.TAB)
    field = driver.switch_to.active_element
    assert field.get_attribute("id") == "api_key"
    field.send_keys(org.key, Keys.ENTER)
    WebDriverWait(driver, 20).until(expected_conditions.url_contains("/console/overview"))


def assert_labelled(driver: webdriver.Chrome) -> None:
    """Every visible form control has a label naming it."""
    for control in driver.find_elements(By.CSS_SELECTOR, "input:not([type=hidden]), select"):
        control_id = control.get_attribute("id")
        assert control_id, control.get_attribute("outerHTML")
        assert driver.find_elements(By.CSS_SELECTOR, f"label[for='{control_id}']"), control_id


def shot(driver: webdriver.Chrome, console: Console, name: str) -> None:
    driver.save_screenshot(str(console.screenshots / f"{name}.png"))


def test_sign_in_makes_a_session_and_the_key_appears_nowhere(
    console: Console, browser: webdriver.Chrome, caplog: pytest.LogCaptureFixture
) -> None:
    browser.get(f"{console.gateway.url}/console/sign-in")
    assert_labelled(browser)
    shot(browser, console, "sign-in")
    sign_in_by_keyboard(browser, console, console.a)
    cookie = browser.get_cookie("cstack_console")
    assert cookie is not None
    assert cookie["httpOnly"] is True and cookie["sameSite"] == "Strict"
    assert cookie["path"] == "/console" and cookie.get("expiry")
    assert cookie["secure"] is False  # plain http here; https sets it (test_console_access)
    for page in ("overview", "usage", "receipts", "invoice", "keys"):
        browser.get(f"{console.gateway.url}/console/{page}")
        assert console.a.key not in browser.page_source
        assert console.a.key not in browser.current_url
        assert_labelled(browser)
    assert console.a.key not in caplog.text


def test_overview_shows_this_months_spend_as_the_api_does(
    console: Console, browser: webdriver.Chrome
) -> None:
    sign_in_by_keyboard(browser, console, console.a)
    totals = api(console, console.a).get("/v1/usage").json()["totals"]
    assert text_of(browser, "org-id") == console.a.org_id
    assert text_of(browser, "list-cost") == totals["list_cost"]
    assert text_of(browser, "allowance-used") == totals["allowance_used"]
    assert text_of(browser, "promotion-savings") == totals["promotion_savings"]
    assert text_of(browser, "overage") == totals["overage"]
    assert text_of(browser, "requests") == str(totals["requests"]) == str(RECEIPTS_A)
    assert text_of(browser, "allowance-of").endswith("of $100.000000000")  # plan pro
    assert text_of(browser, "overage-of").endswith("of $1000.000000000")
    shot(browser, console, "overview")


def test_usage_chart_and_table_equal_the_api(console: Console, browser: webdriver.Chrome) -> None:
    sign_in_by_keyboard(browser, console, console.a)
    month = datetime.now(UTC).strftime("%Y-%m")
    browser.get(f"{console.gateway.url}/console/usage?month={month}")
    WebDriverWait(browser, 30).until(
        lambda d: (
            d.find_elements(By.CSS_SELECTOR, "#cost-chart .main-svg")
            and d.find_elements(By.CSS_SELECTOR, "#tokens-chart .main-svg")
        )
    )
    start = f"{month}-01"
    params = {"start": start, "group_by": "model"}
    summary = api(console, console.a).get("/v1/usage", params=params).json()
    rows = browser.find_elements(By.CSS_SELECTOR, "#usage-table tbody tr")
    shown = [[cell.text for cell in row.find_elements(By.TAG_NAME, "td")] for row in rows]
    expected = [
        [
            r["date"],
            r["tier"],
            r["model"],
            str(r["requests"]),
            str(r["prompt_tokens"]),
            str(r["cached_tokens"]),
            str(r["completion_tokens"]),
            r["list_cost"],
            r["allowance_used"],
            r["promotion_savings"],
            r["overage"],
        ]
        for r in summary["data"]
    ]
    assert shown == expected
    assert text_of(browser, "month-list-cost") == summary["totals"]["list_cost"]
    # The chart's bars are the table's: plotly holds the figures it drew.
    drawn = browser.execute_script(
        "return document.getElementById('cost-chart').data"
        ".map(t => [t.name, t.y.reduce((a, b) => a + b, 0)]);"
    )
    total = sum(value for _, value in drawn)
    assert total == pytest.approx(summary["totals"]["list_cost_nano_usd"] / 1e9)
    # A bar series per tier and model.
    assert {name for name, _ in drawn} == {f"{r['tier']} · {r['model']}" for r in summary["data"]}
    assert len(drawn) == 4  # the fixture's receipts: two tiers x two models
    shot(browser, console, "usage")


def receipt_ids(browser: webdriver.Chrome) -> list[str]:
    return [
        link.text
        for link in browser.find_elements(By.CSS_SELECTOR, "#receipts-table tbody td:first-child a")
    ]


def test_receipts_table_pages_and_details_equal_the_api(
    console: Console, browser: webdriver.Chrome
) -> None:
    sign_in_by_keyboard(browser, console, console.a)
    client = api(console, console.a)
    browser.get(f"{console.gateway.url}/console/receipts")
    first = client.get("/v1/usage/requests", params={"limit": 25}).json()
    assert receipt_ids(browser) == [r["id"] for r in first["data"]]
    shot(browser, console, "receipts")
    navigate(browser, browser.find_element(By.ID, "next-page"))
    rest = client.get("/v1/usage/requests", params={"limit": 25, "after": first["last_id"]})
    assert receipt_ids(browser) == [r["id"] for r in rest.json()["data"]]
    assert not browser.find_elements(By.ID, "next-page")

    # Filters: the fast tier, as the API filters it.
    browser.get(f"{console.gateway.url}/console/receipts")
    browser.find_element(By.ID, "tier").send_keys("fast")
    browser.find_element(By.ID, "limit").send_keys("100")
    navigate(browser, browser.find_element(By.CSS_SELECTOR, "form.filters button"))
    fast = client.get("/v1/usage/requests", params={"tier": "fast", "limit": 100}).json()
    assert receipt_ids(browser) == [r["id"] for r in fast["data"]] != []

    wanted: dict[str, Any] = fast["data"][0]
    navigate(browser, browser.find_element(By.LINK_TEXT, wanted["id"]))
    assert text_of(browser, "input-tokens") == str(wanted["input_tokens"])
    assert text_of(browser, "output-tokens") == str(wanted["output_tokens"])
    for element_id, field in (
        ("list-cost", "list_cost_nano_usd"),
        ("allowance-consumed", "allowance_consumed_nano_usd"),
        ("promotion-credit", "promotion_credit_nano_usd"),
        ("overage", "overage_nano_usd"),
    ):
        nano = wanted[field]
        assert text_of(browser, element_id) == f"${nano // 10**9}.{nano % 10**9:09d}"
    shot(browser, console, "receipt")


def test_csv_download_is_the_apis_csv(console: Console, browser: webdriver.Chrome) -> None:
    sign_in_by_keyboard(browser, console, console.a)
    month = datetime.now(UTC).strftime("%Y-%m")
    cookie = browser.get_cookie("cstack_console")
    assert cookie is not None
    page = httpx.get(
        f"{console.gateway.url}/console/receipts.csv",
        params={"month": month},
        cookies={"cstack_console": cookie["value"]},
    )
    assert page.status_code == 200, page.text
    assert page.headers["content-disposition"].startswith("attachment;")
    from_api = api(console, console.a).get("/v1/usage/requests.csv", params={"period": month})
    assert page.content == from_api.content
    assert page.text.count("\n") == RECEIPTS_A + 1  # the header and a line per receipt


@pytest.mark.parametrize("months_ago", [0, 1])
def test_invoice_preview_equals_billings(
    console: Console, browser: webdriver.Chrome, months_ago: int
) -> None:
    sign_in_by_keyboard(browser, console, console.a)
    now = datetime.now(UTC)
    year, month = (
        (now.year, now.month - months_ago) if now.month > months_ago else (now.year - 1, 12)
    )
    period = f"{year:04d}-{month:02d}"
    browser.get(f"{console.gateway.url}/console/invoice?month={period}")
    expected = invoice_preview(console.engine, console.book, console.a.org_id, period)
    rows = browser.find_elements(By.CSS_SELECTOR, "#invoice-table tbody tr")
    assert [row.get_attribute("data-key") for row in rows] == [line.key for line in expected.lines]
    shown = [row.find_elements(By.TAG_NAME, "td")[2].text for row in rows]
    assert shown == [format_cents(line.amount_cents) for line in expected.lines]
    assert text_of(browser, "invoice-total") == format_cents(expected.total_cents)
    if months_ago == 0:
        shot(browser, console, "invoice")


def test_keys_page_shows_the_orgs_keys_and_limits(
    console: Console, browser: webdriver.Chrome
) -> None:
    sign_in_by_keyboard(browser, console, console.a)
    browser.get(f"{console.gateway.url}/console/keys")
    table = browser.find_element(By.ID, "keys-table").text
    assert f"sk-cs-{console.a.key_id}" in table and console.b.key_id not in table
    assert text_of(browser, "default-tier") == "fast"
    assert (text_of(browser, "rpm"), text_of(browser, "tpm")) == ("600", "2000000")  # pro's
    # Last use and this month's figures, as the key's receipts add up.
    month_start = datetime.now(UTC).replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    receipts = api(console, console.a).get(
        "/v1/usage/requests",
        params={
            "key_id": console.a.key_id,
            "start_time": int(month_start.timestamp()),
            "limit": 1000,
        },
    )
    this_month = receipts.json()["data"]
    [row] = [
        row
        for row in browser.find_elements(By.CSS_SELECTOR, "#keys-table tbody tr")
        if f"sk-cs-{console.a.key_id}" in row.text
    ]
    last_used = max(datetime.fromisoformat(r["started_at"]) for r in this_month)
    assert row.find_element(By.CLASS_NAME, "last-used").text == last_used.strftime(
        "%Y-%m-%d %H:%M:%S UTC"
    )
    assert len(this_month) >= RECEIPTS_A
    assert row.find_element(By.CLASS_NAME, "requests").text == str(len(this_month))
    list_cost = sum(r["list_cost_nano_usd"] for r in this_month)
    assert row.find_element(By.CLASS_NAME, "list-cost").text == format_nano_usd(list_cost)
    shot(browser, console, "keys")
