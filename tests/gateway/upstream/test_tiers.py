"""Tier routing from settings and serving's variants file (no services needed)."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from gateway.api.protocol import ChatCompletionRequest
from gateway.api.shaping import UNSTREAMED_STREAM_INTERVAL, shape_request
from gateway.errors import GatewayError
from gateway.settings import GatewaySettings
from gateway.upstream.tiers import TierRouter
from serving.settings import ServingSettings
from serving.variants import load_variants


def test_shared_engine_gets_serving_priorities_separate_pools_none() -> None:
    shared = load_variants(ServingSettings().variants_file).variant("shared").tier_priority
    router = TierRouter.from_settings(GatewaySettings(upstream_url="http://engine:8000"))
    assert router.resolve("composer-2.5-fast", None).priority == shared["fast"]
    assert router.resolve("composer-2.5-standard", None).priority == shared["standard"]
    split = TierRouter.from_settings(
        GatewaySettings(
            fast_upstream_urls="http://fast-a:8000,http://fast-b:8000",  # type: ignore[arg-type]
            standard_upstream_urls="http://standard:8000",  # type: ignore[arg-type]
        )
    )
    route = split.resolve("composer-2.5", "standard")
    assert (route.tier, route.priority, route.served_model) == ("standard", None, "composer-2.5")


def test_family_model_takes_the_tier_from_service_tier() -> None:
    router = TierRouter("composer-2.5", None, {"fast": 8, "standard": 16})
    assert router.resolve("composer-2.5", None).tier == "fast"
    assert router.resolve("composer-2.5", "auto").tier == "fast"
    assert router.resolve("composer-2.5", "flex").max_tokens == 16
    assert router.resolve("composer-2.5-fast", "standard").tier == "fast"
    with pytest.raises(GatewayError) as unknown:
        router.resolve("composer-3", None)
    assert (unknown.value.status_code, unknown.value.code) == (404, "model_not_found")


def test_upstream_env_vars(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CSTACK_UPSTREAM_URL", "http://one:8000/")
    monkeypatch.setenv("CSTACK_STANDARD_UPSTREAM_URLS", "http://s1:8000, http://s2:8000")
    settings = GatewaySettings()
    assert settings.upstreams_for("fast") == ["http://one:8000"]
    assert settings.upstreams_for("standard") == ["http://s1:8000", "http://s2:8000"]
    assert settings.admin_token is None


def test_upstream_urls_must_be_http_origins() -> None:
    with pytest.raises(ValidationError, match="not an http://host"):
        GatewaySettings(upstream_url="http://engine:8000/v1")
    with pytest.raises(ValidationError, match="not an http://host"):
        GatewaySettings(fast_upstream_urls="https://fast:443")  # type: ignore[arg-type]


def test_standard_streams_in_chunks_on_a_shared_engine_only_and_whole_answers_everywhere() -> None:
    chunked = load_variants(ServingSettings().variants_file).variant("shared")
    assert chunked.tier_stream_interval == {"standard": 8}
    settings = GatewaySettings(upstream_url="http://engine:8000")
    router = TierRouter.from_settings(settings)
    messages = [{"role": "user", "content": "hi"}]

    def upstream_body(tier: str, stream: bool) -> dict[str, object]:
        parsed = ChatCompletionRequest.model_validate(
            {"model": f"composer-2.5-{tier}", "messages": messages, "stream": stream}
        )
        route = router.resolve(parsed.model, None)
        shape = shape_request(parsed, route, 100, settings, None)
        return dict(json.loads(shape.upstream_body))

    assert upstream_body("standard", stream=True)["stream_interval"] == 8
    assert "stream_interval" not in upstream_body("fast", stream=True)
    # An answer assembled whole is read in larger chunks on every engine, either tier.
    for tier in ("standard", "fast"):
        assert upstream_body(tier, stream=False)["stream_interval"] == UNSTREAMED_STREAM_INTERVAL
    split = TierRouter.from_settings(
        GatewaySettings(
            fast_upstream_urls="http://fast:8000",  # type: ignore[arg-type]
            standard_upstream_urls="http://standard:8000",  # type: ignore[arg-type]
        )
    )
    assert split.resolve("composer-2.5-standard", None).stream_interval is None
