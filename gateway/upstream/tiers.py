"""A request's public model and ``service_tier`` -> its tier -> what vLLM is asked for.

Which tier a request gets is ``serving.vocabulary``'s rule; here the tier decides the upstream
pool, the output cap and, when both tiers share one engine, vLLM's scheduling
``priority`` (from serving's ``shared`` variant). Every route also carries the variants
file's thinking budget per ``reasoning_effort``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from gateway.errors import GatewayError, bad_request
from gateway.settings import GatewaySettings
from serving.settings import ServingSettings
from serving.variants import VariantBook, load_variants
from serving.vocabulary import (
    DEFAULT_TIER,
    PUBLIC_MODELS,
    TIERS,
    Tier,
    UnknownModel,
    UnknownServiceTier,
    resolve_tier,
)


@dataclass(frozen=True)
class TierRoute:
    tier: Tier
    public_model: str
    served_model: str
    #: vLLM request priority (lower runs first); None when each tier has its own engine.
    priority: int | None
    max_tokens: int
    #: ``reasoning_effort`` -> vLLM's ``thinking_token_budget``; an effort not here does
    #: not think (serving/variants.yaml's ``reasoning``). Not hashed: a dict cannot be.
    thinking_budgets: Mapping[str, int] = field(default_factory=dict, hash=False)
    #: Output tokens per streamed chunk (vLLM's ``stream_interval``); None: every token.
    stream_interval: int | None = None


class TierRouter:
    def __init__(
        self,
        served_model: str,
        priorities: dict[str, int] | None,
        max_tokens: dict[str, int],
        thinking_budgets: Mapping[str, int] | None = None,
        stream_intervals: Mapping[str, int] | None = None,
    ) -> None:
        self._routes = {
            (model, tier): TierRoute(
                tier=tier,
                public_model=model,
                served_model=served_model,
                priority=None if priorities is None else priorities.get(tier, 0),
                max_tokens=max_tokens[tier],
                thinking_budgets=dict(thinking_budgets or {}),
                stream_interval=(stream_intervals or {}).get(tier),
            )
            for model in PUBLIC_MODELS
            for tier in TIERS
        }

    @classmethod
    def from_settings(
        cls, settings: GatewaySettings, book: VariantBook | None = None
    ) -> TierRouter:
        """``book``: serving's variants, when the caller has loaded them already."""
        book = book or load_variants(ServingSettings().variants_file)
        share = settings.send_tier_priority
        if share is None:
            share = bool(
                set(settings.upstreams_for("fast")) & set(settings.upstreams_for("standard"))
            )
        shared = book.variant("shared")
        priorities = shared.tier_priority if share else None
        return cls(
            served_model=settings.served_model_name or book.served_model_name,
            priorities=priorities,
            max_tokens={tier: settings.max_tokens_for(tier) for tier in TIERS},
            thinking_budgets=book.thinking_budgets,
            stream_intervals=shared.tier_stream_interval if share else None,
        )

    def route(self, model: str, tier: Tier) -> TierRoute:
        """``model`` served by ``tier`` whatever the request asked (a fast request that
        overflows to standard); ``model`` is one ``resolve`` accepted."""
        return self._routes[(model, tier)]

    def resolve(
        self, model: str, service_tier: str | None, org_default: Tier = DEFAULT_TIER
    ) -> TierRoute:
        try:
            tier = resolve_tier(model, service_tier, org_default)
        except UnknownModel as exc:
            raise GatewayError(404, str(exc), param="model", code="model_not_found") from None
        except UnknownServiceTier as exc:
            raise bad_request(str(exc), param="service_tier") from None
        return self._routes[(model, tier)]
