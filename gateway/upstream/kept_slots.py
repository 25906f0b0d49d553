"""Slots an org gave back, kept for it a moment (``SlotPolicy.keep_s``) against orgs over
their share of a tier: a closed-loop client's next request arrives a moment after its last
one ended, and an org whose requests end together (streams of one length, started
together) would otherwise find the busy org in its slots. ``EngineSlots`` keeps one per
tier; it owns the rule, this only the bookkeeping.
"""

from __future__ import annotations

from collections import OrderedDict


class KeptSlots:
    """Slots kept per org until a time, soonest to end first, with their total."""

    def __init__(self, keep_s: float) -> None:
        self.keep_s = keep_s
        self._kept: OrderedDict[str, tuple[int, float]] = OrderedDict()
        self._total = 0

    def keep(self, org: str, slots: int, now: float) -> None:
        """``org`` gave ``slots`` back: they are its own until ``now + keep_s`` (with any
        it has kept, whose time starts over)."""
        self._expire(now)
        already = self._kept.get(org, (0, 0.0))[0]
        self._kept[org] = (already + slots, now + self.keep_s)
        self._kept.move_to_end(org)  # the latest to end
        self._total += slots

    def take(self, org: str, slots: int) -> None:
        """``org`` takes ``slots``: those kept for it go first."""
        if org not in self._kept:
            return
        count, until = self._kept[org]
        used = min(count, slots)
        self._total -= used
        if count > used:
            self._kept[org] = (count - used, until)  # its place (when it ends) unchanged
        else:
            del self._kept[org]

    def for_others(self, org: str, now: float) -> int:
        """The slots kept for orgs other than ``org``."""
        self._expire(now)
        return self._total - self._kept.get(org, (0, 0.0))[0]

    def next_end(self, now: float) -> float | None:
        """When the soonest kept slots stop being kept (None: none are)."""
        self._expire(now)
        return next(iter(self._kept.values()))[1] if self._kept else None

    def items(self, now: float) -> dict[str, int]:
        """The slots kept for each org."""
        self._expire(now)
        return {org: count for org, (count, _) in self._kept.items()}

    def _expire(self, now: float) -> None:
        while self._kept and next(iter(self._kept.values()))[1] <= now:
            self._total -= self._kept.popitem(last=False)[1][0]
