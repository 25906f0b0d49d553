"""Orgs and API keys in Redis. Keys are stored as SHA-256 digests, never in plaintext.

A key reads ``sk-cs-<key_id>.<secret>``: the id locates the record in one lookup, the
secret (256 random bits) is what the digest protects. A fast hash is enough for secrets of
that entropy; a slow password hash would only add latency to every uncached request.
Every revocation also increments ``cstack:keys:epoch``, once the revocation is written:
gateway replicas poll that counter to drop their caches (see ``gateway.access.auth``). Writes
that go together are made one after the other, not as one transaction, because on a
Redis Cluster their keys are in different slots; the order makes an interruption safe
(a revocation without its epoch is seen when the caches expire).
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import time
from dataclasses import asdict, dataclass, replace

from redis.asyncio import Redis

from serving.vocabulary import DEFAULT_TIER, TIERS, Tier

KEY_PREFIX = "sk-cs-"
EPOCH_KEY = "cstack:keys:epoch"
ORGS_KEY = "cstack:orgs"
ORG_ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}\Z")
KEY_ID_PATTERN = re.compile(r"^[0-9a-f]{16}\Z")


class KeyStoreError(ValueError):
    """A request the store refuses (unknown org, duplicate org, bad id)."""


@dataclass(frozen=True)
class Org:
    org_id: str
    name: str
    plan: str
    #: A copy of its Stripe customer (billing.stripe.accounts owns it): admission refuses an org
    #: whose customer Stripe suspended.
    customer_id: str
    created_at: float
    #: The tier its requests get without a ``service_tier`` (or with "auto").
    default_tier: Tier = DEFAULT_TIER
    #: Whether a fast request that finds the fast pool full may be served by the standard
    #: pool instead (then answered and billed as standard); off unless an admin allows it.
    fast_overflow: bool = False


@dataclass(frozen=True)
class ApiKey:
    key_id: str
    org_id: str
    plan: str
    name: str
    created_at: float
    revoked_at: float | None = None

    def public(self) -> dict[str, object]:
        return asdict(self)


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def split_token(token: str) -> tuple[str, str] | None:
    """``(key_id, secret)`` of a well-formed key, else None."""
    if not token.startswith(KEY_PREFIX):
        return None
    key_id, dot, secret = token[len(KEY_PREFIX) :].partition(".")
    if not dot or not secret or not KEY_ID_PATTERN.match(key_id):
        return None
    return key_id, secret


def _org_key(org_id: str) -> str:
    return f"cstack:org:{org_id}"


def _org_keys_key(org_id: str) -> str:
    return f"cstack:org:{org_id}:keys"


def _api_key(key_id: str) -> str:
    return f"cstack:apikey:{key_id}"


class KeyStore:
    def __init__(self, redis: Redis, default_plan: str) -> None:
        self.redis = redis
        self.default_plan = default_plan

    async def create_org(
        self,
        org_id: str,
        name: str = "",
        plan: str = "",
        customer_id: str = "",
        default_tier: Tier = DEFAULT_TIER,
        fast_overflow: bool = False,
    ) -> Org:
        if not ORG_ID_PATTERN.match(org_id):
            raise KeyStoreError(
                f"invalid org id {org_id!r}: use 1-64 letters, digits, '_', '.', '-'"
            )
        _check_tier(default_tier)
        org = Org(
            org_id,
            name or org_id,
            plan or self.default_plan,
            customer_id,
            time.time(),
            default_tier,
            fast_overflow,
        )
        created = await self.redis.hsetnx(_org_key(org_id), "org_id", org_id)
        if not created:
            raise KeyStoreError(f"org {org_id!r} already exists")
        await self.redis.hset(_org_key(org_id), mapping=_org_fields(org))
        await self.redis.sadd(ORGS_KEY, org_id)
        return org

    async def get_org(self, org_id: str) -> Org | None:
        # An id no org can have is unknown, never a Redis key of another type (its keys set).
        if not ORG_ID_PATTERN.match(org_id):
            return None
        fields = await self.redis.hgetall(_org_key(org_id))
        if not fields or b"created_at" not in fields:
            return None
        return Org(
            org_id=org_id,
            name=fields[b"name"].decode(),
            plan=fields[b"plan"].decode(),
            customer_id=fields.get(b"customer_id", b"").decode(),
            created_at=float(fields[b"created_at"]),
            default_tier=_stored_tier(fields.get(b"default_tier")),
            fast_overflow=fields.get(b"fast_overflow") == b"1",
        )

    async def update_org(
        self,
        org_id: str,
        *,
        default_tier: Tier | None = None,
        fast_overflow: bool | None = None,
        customer_id: str | None = None,
    ) -> Org:
        """Change ``org_id``'s settings (those given; ``customer_id=""`` removes its
        customer); every replica's cached keys see the change within the revocation poll
        (the epoch moves, as for a revocation)."""
        if default_tier is not None:
            _check_tier(default_tier)
        org = await self.get_org(org_id)
        if org is None:
            raise KeyStoreError(f"unknown org {org_id!r}")
        updated = replace(
            org,
            default_tier=org.default_tier if default_tier is None else default_tier,
            fast_overflow=org.fast_overflow if fast_overflow is None else fast_overflow,
            customer_id=org.customer_id if customer_id is None else customer_id,
        )
        fields = _org_fields(updated)
        await self.redis.hset(
            _org_key(org_id),
            mapping={
                name: fields[name] for name in ("default_tier", "fast_overflow", "customer_id")
            },
        )
        await self.redis.incr(EPOCH_KEY)
        return updated

    async def create_key(self, org_id: str, plan: str = "", name: str = "") -> tuple[str, ApiKey]:
        """A new key for an existing org: ``(plaintext shown once, stored record)``."""
        org = await self.get_org(org_id)
        if org is None:
            raise KeyStoreError(f"unknown org {org_id!r}")
        key_id = secrets.token_hex(8)
        token = f"{KEY_PREFIX}{key_id}.{secrets.token_urlsafe(32)}"
        record = ApiKey(key_id, org_id, plan or org.plan, name, time.time())
        # Listed first: a key that exists is always in its org's list (a listed id whose
        # record was never written is skipped by list_keys).
        await self.redis.sadd(_org_keys_key(org_id), key_id)
        await self.redis.hset(
            _api_key(key_id),
            mapping={
                "org_id": org_id,
                "plan": record.plan,
                "name": name,
                "created_at": repr(record.created_at),
                "digest": digest(token),
            },
        )
        return token, record

    async def revoke_key(self, key_id: str) -> ApiKey:
        record = await self.get_key(key_id)
        if record is None:
            raise KeyStoreError(f"unknown key {key_id!r}")
        if record.revoked_at is not None:
            return record
        revoked_at = time.time()
        await self.redis.hset(_api_key(key_id), "revoked_at", repr(revoked_at))
        await self.redis.incr(EPOCH_KEY)
        return ApiKey(**{**record.public(), "revoked_at": revoked_at})  # type: ignore[arg-type]

    async def get_key(self, key_id: str) -> ApiKey | None:
        if not KEY_ID_PATTERN.match(key_id):
            return None
        fields = await self.redis.hgetall(_api_key(key_id))
        return _key_record(key_id, fields) if fields else None

    async def list_keys(self, org_id: str) -> list[ApiKey]:
        if not ORG_ID_PATTERN.match(org_id):
            return []
        key_ids = sorted(
            member.decode() for member in await self.redis.smembers(_org_keys_key(org_id))
        )
        records = [await self.get_key(key_id) for key_id in key_ids]
        return sorted((r for r in records if r is not None), key=lambda r: r.created_at)

    async def verify(self, token: str) -> ApiKey | None:
        """The live record of a presented key, or None if unknown, forged or revoked."""
        parts = split_token(token)
        if parts is None:
            return None
        fields = await self.redis.hgetall(_api_key(parts[0]))
        if not fields or not hmac.compare_digest(fields[b"digest"].decode(), digest(token)):
            return None
        record = _key_record(parts[0], fields)
        return None if record.revoked_at is not None else record

    async def epoch(self) -> int:
        return int(await self.redis.get(EPOCH_KEY) or 0)


def _org_fields(org: Org) -> dict[str | bytes, str | bytes | int | float]:
    return {
        "org_id": org.org_id,
        "name": org.name,
        "plan": org.plan,
        "customer_id": org.customer_id,
        "created_at": repr(org.created_at),
        "default_tier": org.default_tier,
        "fast_overflow": int(org.fast_overflow),
    }


def _check_tier(tier: str) -> None:
    if tier not in TIERS:
        raise KeyStoreError(f"invalid tier {tier!r}: one of {', '.join(TIERS)}")


def _stored_tier(value: bytes | None) -> Tier:
    """An org stored before tiers had a default per org gets the product's default."""
    tier = value.decode() if value else DEFAULT_TIER
    return tier if tier in TIERS else DEFAULT_TIER  # type: ignore[return-value]


def _key_record(key_id: str, fields: dict[bytes, bytes]) -> ApiKey:
    revoked = fields.get(b"revoked_at")
    return ApiKey(
        key_id=key_id,
        org_id=fields[b"org_id"].decode(),
        plan=fields[b"plan"].decode(),
        name=fields.get(b"name", b"").decode(),
        created_at=float(fields[b"created_at"]),
        revoked_at=float(revoked) if revoked else None,
    )
