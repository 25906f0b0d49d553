"""Public model ids -> tier -> what the upstream vLLM is asked for.

``composer-2.5`` takes its tier from ``service_tier`` (default fast); the two suffixed ids
fix the tier and ignore ``service_tier``. The tier decides the upstream pool, the output
cap, and, when both tiers share one engine, vLLM's scheduling ``priority``.
"""

from __future__ import annotations

from dataclasses import dataclass

from billing.meter import Tier
from gateway.errors import GatewayError, bad_request
from gateway.settings import GatewaySettings

TIERS: tuple[Tier, ...] = ("fast", "standard")
FAMILY_MODEL = "composer-2.5"
PUBLIC_MODELS: dict[str, Tier | None] = {
    FAMILY_MODEL: None,
    "composer-2.5-fast": "fast",
    "composer-2.5-standard": "standard",
}
#: OpenAI's own ``service_tier`` values map onto ours so unmodified clients work.
SERVICE_TIERS: dict[str, Tier] = {
    "auto": "fast",
    "default": "fast",
    "fast": "fast",
    "priority": "fast",
    "standard": "standard",
    "flex": "standard",
}


@dataclass(frozen=True)
class TierRoute:
    tier: Tier
    public_model: str
    served_model: str
    #: vLLM request priority (lower runs first); None when each tier has its own engine.
    priority: int | None
    max_tokens: int


class TierRouter:
    def __init__(
        self, served_model: str, priorities: dict[str, int] | None, max_tokens: dict[str, int]
    ) -> None:
        self._routes = {
            (model, tier): TierRoute(
                tier=tier,
                public_model=model,
                served_model=served_model,
                priority=None if priorities is None else priorities.get(tier, 0),
                max_tokens=max_tokens[tier],
            )
            for model in PUBLIC_MODELS
            for tier in TIERS
        }

    @classmethod
    def from_settings(cls, settings: GatewaySettings) -> TierRouter:
        from serving import ServingSettings, load_variants

        book = load_variants(ServingSettings().variants_file)
        share = settings.send_tier_priority
        if share is None:
            share = bool(
                set(settings.upstreams_for("fast")) & set(settings.upstreams_for("standard"))
            )
        priorities = book.variant("shared").tier_priority if share else None
        return cls(
            served_model=settings.served_model_name or book.served_model_name,
            priorities=priorities,
            max_tokens={tier: settings.max_tokens_for(tier) for tier in TIERS},
        )

    def resolve(self, model: str, service_tier: str | None) -> TierRoute:
        if model not in PUBLIC_MODELS:
            known = ", ".join(PUBLIC_MODELS)
            raise GatewayError(
                404,
                f"The model {model!r} does not exist (available: {known})",
                param="model",
                code="model_not_found",
            )
        tier = PUBLIC_MODELS[model]
        if tier is None:
            if service_tier is None:
                tier = "fast"
            elif service_tier in SERVICE_TIERS:
                tier = SERVICE_TIERS[service_tier]
            else:
                known = ", ".join(SERVICE_TIERS)
                raise bad_request(
                    f"service_tier: unknown tier {service_tier!r} (one of {known})",
                    param="service_tier",
                )
        return self._routes[(model, tier)]
