"""The usage event the gateway writes without validating (``usage_event_json``) is, for any
request, byte for byte what the validated model writes, and validates as it: the ledger
writer reads exactly what a validated event would have said (hypothesis)."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, timedelta, timezone

from hypothesis import given
from hypothesis import strategies as st

from billing.meter.events import (
    AnswerCharges,
    UsageEvent,
    answer_cost,
    usage_charge,
    usage_event,
    usage_event_fields,
    usage_event_json,
)
from billing.meter.protocol import Admission, AdmissionRequest, UsageReport
from billing.prices.pricing import load_pricebook
from billing.settings import DEFAULT_PRICEBOOK_PATH

BOOK = load_pricebook(DEFAULT_PRICEBOOK_PATH)
LAUNCH = BOOK.promotions[0].starts_at

#: Around the launch week (promotion on and off), in UTC, another zone, or naive (UTC).
instants = st.builds(
    lambda seconds, micros, zone: (
        (LAUNCH + timedelta(seconds=seconds, microseconds=micros))
        .astimezone(zone)
        .replace(tzinfo=None if zone is None else zone)
    ),
    st.integers(min_value=-3 * 86400, max_value=11 * 86400),
    st.integers(min_value=0, max_value=999_999),
    st.sampled_from([UTC, timezone(timedelta(hours=-5)), timezone(timedelta(hours=9)), None]),
)


@st.composite
def reports(draw: st.DrawFn) -> tuple[Admission, UsageReport]:
    prompt = draw(st.integers(min_value=0, max_value=10_000_000))
    started = draw(instants)
    usage = UsageReport(
        request_id=draw(st.text(min_size=1, max_size=200)),
        org_id=draw(st.text(min_size=1, max_size=40)),
        key_id=draw(st.text(max_size=40)),
        model=draw(st.sampled_from(["composer-2.5", "composer-2.5-fast", "composer-2.5-standard"])),
        tier=draw(st.sampled_from(["standard", "fast"])),
        prompt_tokens=prompt,
        cached_tokens=draw(st.integers(min_value=0, max_value=prompt)),
        completion_tokens=draw(st.integers(min_value=0, max_value=10_000_000)),
        started_at=started,
        ended_at=started + timedelta(seconds=draw(st.integers(min_value=0, max_value=3600))),
        outcome=draw(
            st.sampled_from(["complete", "client_disconnect", "upstream_error", "max_duration"])
        ),
        customer_id=draw(st.none() | st.text(max_size=40)),
    )
    request = AdmissionRequest(
        request_id=usage.request_id,
        org_id=usage.org_id,
        key_id=usage.key_id,
        plan=draw(st.sampled_from(sorted(BOOK.plans))),
        tier=usage.tier,
        model=usage.model,
        prompt_tokens=prompt,
        max_output_tokens=usage.completion_tokens,
    )
    return Admission(request=request), usage


@given(reports())
def test_the_unvalidated_event_is_the_validated_one(case: tuple[Admission, UsageReport]) -> None:
    admission, usage = case
    validated = usage_event(BOOK, admission, usage)
    written = usage_event_json(usage_event_fields(BOOK, admission, usage))
    assert written == validated.model_dump_json()
    assert UsageEvent.model_validate_json(written) == validated


@given(reports(), st.integers(min_value=0, max_value=5), st.booleans())
def test_an_answer_and_its_event_are_priced_alike_once(
    case: tuple[Admission, UsageReport], more: int, same_usage: bool
) -> None:
    """The settlement takes back the charge made for the answer's ``cstack_cost`` only for
    the same usage: what it writes is what pricing the event anew writes, either way."""
    admission, usage = case
    charges = AnswerCharges()
    priced = usage_charge(BOOK, usage)
    charges.remember(usage, priced)
    assert answer_cost(BOOK, usage, priced) == answer_cost(BOOK, usage)
    settled = (
        usage
        if same_usage
        else replace(usage, completion_tokens=usage.completion_tokens + more + 1)
    )
    taken = charges.take(settled)
    assert (taken is priced) == same_usage
    assert usage_event_fields(BOOK, admission, settled, taken) == usage_event_fields(
        BOOK, admission, settled
    )
    assert charges.take(settled) is None  # once


def test_answer_charges_are_bounded() -> None:
    at = LAUNCH
    charges = AnswerCharges(limit=3)
    reports = [
        UsageReport(f"r{i}", "org", "key", "composer-2.5", "fast", 10, 0, 5, at, at, "complete")
        for i in range(4)
    ]
    for report in reports:
        charges.remember(report, usage_charge(BOOK, report))
    assert charges.take(reports[0]) is None  # forgotten when the fourth came
    assert charges.take(reports[3]) is not None


def test_an_event_in_the_launch_week_names_its_promotion() -> None:
    at = LAUNCH + timedelta(hours=1)
    request = AdmissionRequest("req-1", "org", "key", "pro", "fast", "composer-2.5", 10, 5)
    usage = UsageReport("req-1", "org", "key", "composer-2.5", "fast", 10, 0, 5, at, at, "complete")
    event = UsageEvent.model_validate_json(
        usage_event_json(usage_event_fields(BOOK, Admission(request=request), usage))
    )
    assert event.promotion_id is not None and event.multiplier > 1
    assert event.list_cost_nano_usd == 10 * 3000 + 5 * 15000
    assert event.allowance_cost_nano_usd * event.multiplier == event.list_cost_nano_usd


def test_an_event_of_a_release_before_the_promotion_rule_still_validates() -> None:
    """Events then named the allowance cost ``allowance_consumed_nano_usd``: those still
    in a usage stream, a spool or the dead letters when the ledger is upgraded."""
    at = LAUNCH + timedelta(hours=1)
    request = AdmissionRequest("req-2", "org", "key", "pro", "fast", "composer-2.5", 10, 5)
    usage = UsageReport("req-2", "org", "key", "composer-2.5", "fast", 10, 0, 5, at, at, "complete")
    fields = usage_event_fields(BOOK, Admission(request=request), usage)
    fields["allowance_consumed_nano_usd"] = fields.pop("allowance_cost_nano_usd")
    event = UsageEvent.model_validate_json(usage_event_json(fields))
    assert event.allowance_cost_nano_usd == (10 * 3000 + 5 * 15000) // 2
