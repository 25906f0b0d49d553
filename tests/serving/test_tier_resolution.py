"""Which tier a request is served and billed in: one rule, in serving.vocabulary."""

from __future__ import annotations

import pytest

from serving.vocabulary import (
    DEFAULT_TIER,
    PUBLIC_MODELS,
    TIERS,
    UnknownModel,
    UnknownServiceTier,
    resolve_tier,
)


def test_fast_is_the_default_tier() -> None:
    assert DEFAULT_TIER == TIERS[0] == "fast"
    assert resolve_tier("composer-2.5", None) == "fast"
    assert resolve_tier("composer-2.5", "auto") == "fast"
    assert resolve_tier("composer-2.5", "standard") == "standard"
    assert resolve_tier("composer-2.5", "flex") == "standard"


def test_a_suffixed_model_fixes_its_tier() -> None:
    assert resolve_tier("composer-2.5-standard", None) == "standard"
    assert resolve_tier("composer-2.5-fast", "standard") == "fast"
    assert resolve_tier("composer-2.5-fast", "no-such-tier") == "fast"
    assert {tier for tier in PUBLIC_MODELS.values() if tier} == set(TIERS)


def test_unknown_models_and_service_tiers_are_refused() -> None:
    with pytest.raises(UnknownModel, match="'composer-3' does not exist"):
        resolve_tier("composer-3", None)
    with pytest.raises(UnknownModel):
        resolve_tier("my-model-fast", None)
    with pytest.raises(UnknownServiceTier, match="unknown tier 'turbo'"):
        resolve_tier("composer-2.5", "turbo")


def test_openai_values_keep_openais_meaning_and_auto_is_the_orgs_default() -> None:
    for org_default in TIERS:
        assert resolve_tier("composer-2.5", None, org_default) == org_default
        assert resolve_tier("composer-2.5", "auto", org_default) == org_default
        assert resolve_tier("composer-2.5", "default", org_default) == "standard"
        assert resolve_tier("composer-2.5", "priority", org_default) == "fast"
        assert resolve_tier("composer-2.5-fast", None, org_default) == "fast"
