"""Where billing's state lives in Redis: every key name, and the shard each org is on.

An org's admission and settlement scripts touch several keys at once (its key's rate
limit, its suspension flags, its budget and reservations, the settled markers, the usage
stream), and a Redis Cluster runs a script only when all of its keys are in one hash
slot. So every key of an org carries its shard's hash tag (``{u7}``): an org is on one
of ``shards`` shards, chosen by a stable hash of its id, and each shard has its own usage
stream. On a single Redis the tags change nothing but the names.

The number of shards is fixed for a deployment's life (``CSTACK_BILLING_SHARDS``):
changing it would move orgs to other shards, away from their budgets. Its default of 16
spreads the load over up to 16 cluster primaries.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from functools import lru_cache


@lru_cache(maxsize=65536)
def shard_of(org_id: str, shards: int) -> int:
    """The shard an org's keys are on: stable across processes and releases (remembered:
    every admission and settlement asks, a few times, for few orgs)."""
    return zlib.crc32(org_id.encode()) % shards


@dataclass(frozen=True)
class Keyspace:
    """Billing's key names for ``shards`` shards, usage streams named after ``usage_stream``."""

    shards: int
    usage_stream: str

    def tag(self, org_id: str) -> str:
        return _org_tag(org_id, self.shards)

    def budget_prefix(self, org_id: str) -> str:
        """Prefix of an org's per-period budget keys (the period is appended)."""
        return f"cstack:budget:{self.tag(org_id)}:{org_id}:"

    def ratelimit(self, org_id: str, key_id: str) -> str:
        return f"cstack:ratelimit:{self.tag(org_id)}:{key_id}"

    def suspended_org(self, org_id: str) -> str:
        return f"cstack:suspended:{self.tag(org_id)}:org:{org_id}"

    def admission_keys(
        self, org_id: str, key_id: str, customer_id: str | None, period: str
    ) -> list[str]:
        """The keys of the admission script (``billing.meter.scripts.ADMIT``), in its order: the
        key's rate limit, the org's and the customer's suspension flags, and the org's
        budget of ``period`` with its reservations' expiries and amounts."""
        budget = f"{self.budget_prefix(org_id)}{period}"
        return [
            self.ratelimit(org_id, key_id),
            self.suspended_org(org_id),
            # No customer: a flag no customer id names, on the org's shard like the others.
            self.suspended_customer(org_id, customer_id or ""),
            budget,
            f"{budget}:resv",
            f"{budget}:resv-amount",
        ]

    def suspended_customer(self, org_id: str, customer_id: str) -> str:
        """The flag admission reads for ``org_id``'s customer: on the org's shard."""
        return f"cstack:suspended:{self.tag(org_id)}:customer:{customer_id}"

    def suspended_customer_everywhere(self, customer_id: str) -> list[str]:
        """A customer's flag on every shard: any of its orgs may be on any of them."""
        return [
            f"cstack:suspended:{shard_tag(shard)}:customer:{customer_id}"
            for shard in range(self.shards)
        ]

    def settled_marker(self, org_id: str, event_id: str) -> str:
        return f"cstack:settled:{self.tag(org_id)}:{event_id}"

    def usage_stream_of(self, org_id: str) -> str:
        return self.shard_stream(shard_of(org_id, self.shards))

    def shard_stream(self, shard: int) -> str:
        return f"{self.usage_stream}:{shard_tag(shard)}"

    def usage_streams(self) -> list[str]:
        """Every stream the ledger consumer drains: each shard's, and the one usage
        stream of releases before sharding (entries still there when they were replaced)."""
        return [self.shard_stream(shard) for shard in range(self.shards)] + [self.usage_stream]


def shard_tag(shard: int) -> str:
    return f"{{u{shard}}}"


@lru_cache(maxsize=65536)
def _org_tag(org_id: str, shards: int) -> str:
    """An org's shard tag (remembered, like ``shard_of``: each request names several keys)."""
    return shard_tag(shard_of(org_id, shards))
