"""Budgets written by releases before sharding, merged into their org's shard.

Those releases kept an org's budget for a month under ``cstack:budget:{ORG}:YYYY-MM``.
Upgrading mid-month must not give the org its allowance again, so each such budget's
``used`` is added to the same month's budget on the org's shard, and the old key is
deleted in the same script: merging twice adds nothing. Reservations are not moved (they
are holds of requests in flight, released within their TTL anyway). The billing worker
merges when it starts; ``cstack billing merge-legacy-budgets`` does it on demand, e.g.
once the last gateway of the old release has stopped.

Only a single Redis can hold such keys (there was no cluster support before sharding),
and the script touches keys it does not declare, which a single Redis allows.
"""

from __future__ import annotations

import re

from redis import Redis

from billing.keyspace import Keyspace

LEGACY_BUDGET = re.compile(rb"^cstack:budget:\{(?P<org>[^}]+)\}:(?P<period>\d{4}-\d{2})$")

#: KEYS: none. ARGV: the old budget key, the new one. Returns what was added.
MERGE = """
local used = redis.call('HGET', ARGV[1], 'used')
redis.call('DEL', ARGV[1], ARGV[1] .. ':resv', ARGV[1] .. ':resv-amount')
if not used then return 0 end
redis.call('HINCRBY', ARGV[2], 'used', used)
redis.call('EXPIRE', ARGV[2], 70 * 86400)
return tonumber(used)
"""


def merge_legacy_budgets(redis: Redis, keys: Keyspace) -> int:
    """Merge every pre-sharding budget; how many were merged."""
    merge = redis.register_script(MERGE)
    merged = 0
    for key in redis.scan_iter(match="cstack:budget:{*}:????-??", count=1000):
        found = LEGACY_BUDGET.match(key)
        if found is None:
            continue
        org, period = found["org"].decode(), found["period"].decode()
        merge(keys=[], args=[key, keys.budget_prefix(org) + period])
        merged += 1
    return merged
