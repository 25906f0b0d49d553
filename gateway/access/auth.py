"""Bearer-key authentication with a short in-process cache that revocations cannot outlive.

Verified keys are cached by digest so the hot path costs no Redis round trip. A background
task polls the revocation epoch (``gateway.access.keys.EPOCH_KEY``) every ``revocation_poll_s``
and clears the cache when it moves. A cached entry is trusted only while the last poll
was *issued* less than ``revocation_staleness_s`` ago, so a revocation committed before
that moment has been seen: with the defaults a revoked key stops working on every replica
within 1 s.

While Redis does not answer, a key this replica verified keeps working for
``outage_grace_s`` after the last epoch poll that succeeded (the trade-off: during an
outage a revocation can take that long to reach every replica; once Redis answers again,
the next poll applies it within the normal bound). A key not verified before the outage
gets a 503: nothing can vouch for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass

from billing.contract import REDIS_FAILURES
from gateway.access.keys import ApiKey, KeyStore, digest
from gateway.errors import GatewayError, unauthorized
from serving.vocabulary import DEFAULT_TIER, Tier

logger = logging.getLogger(__name__)
CACHE_MAX_ENTRIES = 100_000


@dataclass(frozen=True)
class Principal:
    """Who is calling: the key's record and its org's billing customer."""

    key: ApiKey
    customer_id: str | None
    #: The tier a request without ``service_tier`` (or with "auto") gets.
    default_tier: Tier = DEFAULT_TIER
    #: Whether its fast requests may be served (and billed) as standard when fast is full.
    fast_overflow: bool = False


class Authenticator:
    def __init__(
        self,
        store: KeyStore,
        cache_ttl_s: float,
        poll_s: float,
        staleness_s: float,
        outage_grace_s: float = 0.0,
    ) -> None:
        self._store = store
        self._cache_ttl_s = cache_ttl_s
        self._poll_s = poll_s
        self._staleness_s = staleness_s
        self._outage_grace_s = outage_grace_s
        self._cache: dict[str, tuple[Principal, float]] = {}
        #: Bumped on every cache clear; a lookup that raced a clear is not cached.
        self._generation = 0
        self._epoch: int | None = None
        self._epoch_checked_at = float("-inf")
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        self._refresh: asyncio.Future[None] | None = None
        #: When a refresh made on a request's behalf last failed: requests then wait for
        #: the poller instead of each trying Redis again.
        self._refresh_failed_at = float("-inf")

    async def authenticate(self, authorization: str | None) -> Principal:
        if not authorization:
            raise unauthorized("Missing API key: send it as 'Authorization: Bearer <key>'.")
        scheme, _, token = authorization.partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise unauthorized("Malformed Authorization header: expected 'Bearer <key>'.")
        token_digest = digest(token)
        cached = self._cache.get(token_digest)
        try:
            if cached is not None and cached[1] > time.monotonic():
                if time.monotonic() - self._epoch_checked_at >= self._staleness_s:
                    # The poller fell behind (a busy loop): one shared epoch read for all
                    # waiting requests, rather than a key lookup each.
                    await self._refresh_epoch()
                if token_digest in self._cache:
                    return cached[0]
            generation = self._generation
            principal = await self._lookup(token)
        except REDIS_FAILURES as exc:
            if cached is not None and self._within_outage_grace(cached[1]):
                return cached[0]
            raise GatewayError(
                503, "API key store unavailable", type="server_error", code="auth_unavailable"
            ) from exc
        now = time.monotonic()
        if principal is None:
            raise unauthorized("Incorrect, unknown or revoked API key.")
        if generation == self._generation:
            if len(self._cache) >= CACHE_MAX_ENTRIES:
                self._cache.pop(next(iter(self._cache)))
            self._cache[token_digest] = (principal, now + self._cache_ttl_s)
        return principal

    async def _lookup(self, token: str) -> Principal | None:
        key = await self._store.verify(token)
        if key is None:
            return None
        org = await self._store.get_org(key.org_id)
        if org is None:
            return Principal(key, None)
        return Principal(key, org.customer_id or None, org.default_tier, org.fast_overflow)

    def _within_outage_grace(self, expires_at: float) -> bool:
        """Whether a cached key may be trusted while Redis does not answer: the last epoch
        poll that succeeded (no revocation until then) is under the grace old, and so is
        the entry's own expiry."""
        now = time.monotonic()
        return (
            now - self._epoch_checked_at < self._outage_grace_s
            and now < expires_at + self._outage_grace_s
        )

    async def _refresh_epoch(self) -> None:
        if self._refresh is None or self._refresh.done():
            if time.monotonic() - self._refresh_failed_at < self._poll_s:
                raise ConnectionError("the revocation epoch could not be read just now")
            self._refresh = asyncio.ensure_future(self.poll_epoch())
        try:
            await asyncio.shield(self._refresh)
        except REDIS_FAILURES:
            self._refresh_failed_at = time.monotonic()
            raise

    def invalidate(self) -> None:
        self._generation += 1
        self._cache.clear()

    async def poll_epoch(self) -> None:
        issued_at = time.monotonic()
        epoch = await self._store.epoch()
        if epoch != self._epoch:
            self._epoch = epoch
            self.invalidate()
        self._epoch_checked_at = issued_at

    async def _poll_loop(self) -> None:
        # Checked, not only cancelled: redis-py may turn a cancellation that lands inside a
        # command into an error of its own, which the handler below swallows; the loop
        # then slept on and ``aclose`` (the gateway's shutdown) waited for it for ever.
        while not self._closed:
            try:
                await self.poll_epoch()
            except Exception as exc:  # keep polling; stale epochs already bypass the cache
                if not self._closed:
                    logger.warning("revocation epoch poll failed: %s", type(exc).__name__)
            if not self._closed:
                await asyncio.sleep(self._poll_s)

    async def start(self) -> None:
        self._task = asyncio.create_task(self._poll_loop())

    async def aclose(self) -> None:
        self._closed = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
