"""The platform's shared terms: the tiers composer-2.5 is sold in, its public model ids, how
a request picks a tier, the reasoning efforts and verbosities it can ask for, and how an
engine shared by both tiers splits its slots by default.

Each tier is served by its own pool (the variant of the same name in
``serving/variants.yaml``), routed by the gateway and priced by billing; the RL loop asks
for efforts and verbosities; all of them take the names from here, and only from here.
This module imports nothing, so every package can depend on it for free.
"""

from __future__ import annotations

import typing
from typing import Literal

from serving.redact import echo

Tier = Literal["fast", "standard"]
#: Every tier, fast first: it is the default, and the one served first when both wait.
TIERS: tuple[Tier, ...] = ("fast", "standard")
DEFAULT_TIER: Tier = "fast"

FAMILY_MODEL = "composer-2.5"
#: Public model ids and the tier each one fixes; the family id (None) takes its tier from
#: the request's ``service_tier``.
PUBLIC_MODELS: dict[str, Tier | None] = {
    FAMILY_MODEL: None,
    "composer-2.5-fast": "fast",
    "composer-2.5-standard": "standard",
}
#: A request's ``service_tier``: ours, and OpenAI's own values with OpenAI's meaning, so
#: unmodified clients work: "auto" (None here) is the org's default tier, as omitting
#: ``service_tier`` is; "default" is OpenAI's standard processing, "priority" its fast
#: one. An answer's value sent back in the next request selects the same tier.
SERVICE_TIERS: dict[str, Tier | None] = {
    "auto": None,
    "default": "standard",
    "fast": "fast",
    "priority": "fast",
    "standard": "standard",
    "flex": "standard",
}
#: The ``service_tier`` an answer reports, in OpenAI's values: clients that validate
#: answers against OpenAI's schema know no others. Fast is OpenAI's priority processing
#: (which answers "priority" whether asked for "fast" or "priority"), standard its
#: "default". Our own name is in the ``x-cstack-tier`` response header.
ANSWER_SERVICE_TIERS: dict[Tier, str] = {"fast": "priority", "standard": "default"}


#: OpenAI's ``reasoning_effort`` values (``openai.types.shared.ReasoningEffort``; the test
#: suite checks they agree) and ``verbosity`` values.
ReasoningEffort = Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"]
REASONING_EFFORTS: tuple[ReasoningEffort, ...] = typing.get_args(ReasoningEffort)
Verbosity = Literal["low", "medium", "high"]
VERBOSITIES: tuple[Verbosity, ...] = typing.get_args(Verbosity)

#: An engine both tiers share: standard may hold at most this share of its slots, and keeps
#: at least this share when it has work (``serving/variants.yaml``'s ``admission`` section
#: says why; the file may override both).
STANDARD_MAX_SHARE = 0.75
STANDARD_MIN_SHARE = 0.25


class UnknownModel(ValueError):
    """The request names a model that is not one of ``PUBLIC_MODELS``."""

    def __init__(self, model: str) -> None:
        known = ", ".join(PUBLIC_MODELS)
        super().__init__(f"The model {echo(model)} does not exist (available: {known})")


class UnknownServiceTier(ValueError):
    """The family model was asked for with a ``service_tier`` not in ``SERVICE_TIERS``."""

    def __init__(self, service_tier: str) -> None:
        known = ", ".join(SERVICE_TIERS)
        super().__init__(f"service_tier: unknown tier {echo(service_tier)} (one of {known})")


def resolve_tier(model: str, service_tier: str | None, org_default: Tier = DEFAULT_TIER) -> Tier:
    """The tier that serves (and so bills) a request for ``model`` with ``service_tier``.

    A suffixed model id fixes its tier and ignores ``service_tier``; the family id follows
    ``service_tier``, and without one (or with "auto") takes the org's default tier.
    """
    if model not in PUBLIC_MODELS:
        raise UnknownModel(model)
    tier = PUBLIC_MODELS[model]
    if tier is not None:
        return tier
    if service_tier is None:
        return org_default
    if service_tier not in SERVICE_TIERS:
        raise UnknownServiceTier(service_tier)
    return SERVICE_TIERS[service_tier] or org_default
