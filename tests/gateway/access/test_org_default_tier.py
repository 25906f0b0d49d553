"""Every ``service_tier`` an OpenAI client may send, through the openai SDK against real
vLLM, with an org whose default tier is standard, then fast: the tier served (and billed)
follows OpenAI's meaning of each value, and the org's default where none is named."""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest

from serving.vocabulary import ANSWER_SERVICE_TIERS, Tier
from tests.support.gateway import ADMIN_TOKEN, GatewayServer, RecordingMeter, cstack_keys

ADMIN = {"authorization": f"Bearer {ADMIN_TOKEN}"}
#: (requested service_tier, tier served for an org whose default is standard, ... fast)
MAPPING: list[tuple[str | None, Tier, Tier]] = [
    (None, "standard", "fast"),
    ("auto", "standard", "fast"),
    ("default", "standard", "standard"),
    ("flex", "standard", "standard"),
    ("standard", "standard", "standard"),
    ("priority", "fast", "fast"),
    ("fast", "fast", "fast"),
]


def served(client: openai.OpenAI, service_tier: str | None) -> tuple[str, str | None]:
    """(x-cstack-tier, the answer's service_tier) of one tiny chat completion."""
    extra: dict[str, Any] = {} if service_tier is None else {"service_tier": service_tier}
    raw = client.chat.completions.with_raw_response.create(
        model="composer-2.5",
        messages=[{"role": "user", "content": "Hi"}],
        max_tokens=1,
        **extra,
    )
    return raw.headers["x-cstack-tier"], raw.parse().service_tier


def test_service_tier_values_and_the_orgs_default(
    start_gateway: Any, vllm_url: str, redis_url: str
) -> None:
    meter = RecordingMeter()
    gateway: GatewayServer = start_gateway(meter=meter, upstream_url=vllm_url)
    org = httpx.post(
        f"{gateway.internal_url}/admin/orgs",
        json={"org_id": "budget-co", "default_tier": "standard"},
        headers=ADMIN,
    )
    assert org.status_code == 201 and org.json()["default_tier"] == "standard"
    key = httpx.post(f"{gateway.internal_url}/admin/orgs/budget-co/keys", headers=ADMIN)
    client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=key.json()["key"], max_retries=0)
    for requested, tier, _ in MAPPING:
        assert served(client, requested) == (tier, ANSWER_SERVICE_TIERS[tier]), requested
    # What was served is what billing was told: the meter settles each request's tier.
    assert [usage.tier for usage in meter.wait_settled(len(MAPPING))] == [
        tier for _, tier, _ in MAPPING
    ]

    changed = httpx.patch(
        f"{gateway.internal_url}/admin/orgs/budget-co",
        json={"default_tier": "fast"},
        headers=ADMIN,
    )
    assert changed.status_code == 200 and changed.json()["default_tier"] == "fast"
    for requested, _, tier in MAPPING:
        assert served(client, requested) == (tier, ANSWER_SERVICE_TIERS[tier]), requested

    # An answer's service_tier, sent back, selects the tier that served it.
    for tier in ("fast", "standard"):
        assert served(client, ANSWER_SERVICE_TIERS[tier])[0] == tier  # type: ignore[index]


def test_bad_default_tiers_are_400s(gateway: GatewayServer) -> None:
    created = httpx.post(
        f"{gateway.internal_url}/admin/orgs",
        json={"org_id": "tiered", "default_tier": "turbo"},
        headers=ADMIN,
    )
    assert created.status_code == 400 and created.json()["error"]["param"] == "default_tier"
    unknown = httpx.patch(
        f"{gateway.internal_url}/admin/orgs/nobody-here",
        json={"default_tier": "standard"},
        headers=ADMIN,
    )
    assert unknown.status_code == 404


@pytest.mark.parametrize("tier", ["standard", "fast"])
def test_cli_sets_the_default_tier(gateway: GatewayServer, redis_url: str, tier: str) -> None:
    created = cstack_keys(redis_url, "create", "--org", "cli-tier-co")
    assert created.exit_code == 0, created.output
    result = cstack_keys(redis_url, "default-tier", "cli-tier-co", tier)
    assert result.exit_code == 0
    assert result.stdout.strip() == f"org cli-tier-co: default tier {tier}"
    org = httpx.get(f"{gateway.internal_url}/admin/orgs/cli-tier-co", headers=ADMIN).json()
    assert org["default_tier"] == tier
    refused = cstack_keys(redis_url, "default-tier", "cli-tier-co", "turbo")
    assert refused.exit_code == 1
    assert refused.stderr.strip() == "error: invalid tier 'turbo': one of fast, standard"
