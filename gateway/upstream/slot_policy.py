"""How an engine's slots are to be shared: each engine's ``SlotPolicy`` from the variant
book (``slot_policies``), and a gateway worker's part of what each process holds alone
(``share``). ``gateway.upstream.engine_slots`` applies a policy to the requests of a moment.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from serving.variants import VariantBook
from serving.vocabulary import STANDARD_MAX_SHARE, STANDARD_MIN_SHARE, Tier


@dataclass(frozen=True)
class SlotPolicy:
    """How one engine's slots are shared (from serving/variants.yaml's ``admission``)."""

    #: The engine's batch size: requests in flight on it at most.
    size: int
    #: Whether both tiers use this engine.
    shared: bool
    standard_max_share: float = STANDARD_MAX_SHARE
    standard_min_share: float = STANDARD_MIN_SHARE
    #: Slots an org over its share of a tier leaves free for the tier's orgs under theirs
    #: (0: none, every freed slot goes to whoever waits).
    fair_headroom: int = 2
    #: How long after its last request ended an org still counts as active in a tier.
    recent_s: float = 1.0
    #: How long slots an org gives back stay kept for it from orgs over their share (its
    #: closed-loop clients' next requests arrive within it; with ``fair_headroom`` 0, none).
    keep_s: float = 0.05

    @property
    def standard_cap(self) -> int:
        return (
            self.size
            if not self.shared
            else max(1, math.floor(self.size * self.standard_max_share))
        )

    @property
    def standard_floor(self) -> int:
        return (
            0
            if not self.shared
            else min(self.standard_cap, math.ceil(self.size * self.standard_min_share))
        )


def share(total: int, worker: int, workers: int) -> int:
    """Worker ``worker``'s part of ``total`` split as evenly as whole units go (the first
    ``total % workers`` workers get one more); the parts add up to ``total``."""
    return total // workers + (1 if worker < total % workers else 0)


def slot_policies(
    urls_by_tier: Mapping[Tier, list[str]], book: VariantBook, profile: str
) -> dict[str, SlotPolicy]:
    """Each engine URL's slot policy: an engine both tiers use runs the ``shared`` variant,
    one tier's engine that tier's variant; its batch size is that variant's
    ``max-num-seqs`` under ``profile`` (no policy, so no limit, where it has none)."""
    tiers_of: dict[str, set[str]] = {}
    for tier, urls in urls_by_tier.items():
        for url in urls:
            tiers_of.setdefault(url, set()).add(tier)
    policies = {}
    for url, tiers in tiers_of.items():
        shared = len(tiers) > 1
        size = book.max_num_seqs("shared" if shared else next(iter(tiers)), profile)
        if size is not None:
            policies[url] = SlotPolicy(
                size,
                shared,
                book.slot_sharing.standard_max_share,
                book.slot_sharing.standard_min_share,
                book.slot_sharing.fair_headroom,
                keep_s=book.slot_sharing.keep_s,
            )
    return policies
