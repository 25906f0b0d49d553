"""Keys through a Redis outage: verified keys keep working for the stated grace, and a
revocation made meanwhile applies within that grace, and within the normal bound once
Redis answers again.

The gateway process's view of Redis is cut by a TCP forwarder that the test closes (a
partition between one gateway and Redis, while an admin revokes the key through Redis
itself), so the revocation really happens during the outage.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from urllib.parse import urlparse

import pytest
import pytest_asyncio
from redis.asyncio import Redis

from gateway.access.auth import Authenticator
from gateway.access.keys import KeyStore
from gateway.errors import GatewayError

pytestmark = pytest.mark.asyncio(loop_scope="function")

POLL_S = 0.1
STALENESS_S = 0.4
GRACE_S = 2.0


class Forwarder:
    """A TCP forwarder to Redis that can be cut (new connections refused, open ones
    closed) and restored."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.cut = False
        self.server: asyncio.Server | None = None
        self.writers: set[asyncio.StreamWriter] = set()

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return int(self.server.sockets[0].getsockname()[1])

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.cut:
            writer.close()
            return
        up_reader, up_writer = await asyncio.open_connection(*self.target)
        self.writers |= {writer, up_writer}

        async def pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
            with contextlib.suppress(OSError):
                while data := await source.read(65536):
                    sink.write(data)
                    await sink.drain()
            sink.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    def sever(self) -> None:
        self.cut = True
        for writer in self.writers:
            writer.close()
        self.writers.clear()

    async def aclose(self) -> None:
        self.sever()
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()


@dataclass
class Partition:
    """A gateway's path to Redis that the test can cut, and an admin's that stays up."""

    forwarder: Forwarder
    #: The admin's own path to Redis, never cut.
    admin: KeyStore
    #: The gateway's, through the forwarder.
    gateway: KeyStore


@pytest_asyncio.fixture(loop_scope="function")  # the forwarder serves on the test's loop
async def partition(redis_url: str) -> AsyncIterator[Partition]:
    target = urlparse(redis_url)
    forwarder = Forwarder(target.hostname or "127.0.0.1", target.port or 6379)
    port = await forwarder.start()
    through = target._replace(netloc=f":{target.password}@127.0.0.1:{port}").geturl()
    admin = Redis.from_url(redis_url)
    gateway_redis = Redis.from_url(through, socket_timeout=0.5, socket_connect_timeout=0.5)
    try:
        yield Partition(forwarder, KeyStore(admin, "default"), KeyStore(gateway_redis, "default"))
    finally:
        await forwarder.aclose()
        await gateway_redis.aclose()
        await admin.aclose()


@contextlib.asynccontextmanager
async def authenticator(store: KeyStore, **grace: float) -> AsyncIterator[Authenticator]:
    """The gateway's authenticator on ``store``, once its first poll has read the epoch
    (and cleared the cache)."""
    auth = Authenticator(store, cache_ttl_s=30.0, poll_s=POLL_S, staleness_s=STALENESS_S, **grace)
    await auth.start()
    try:
        await asyncio.sleep(POLL_S * 3)
        yield auth
    finally:
        await auth.aclose()


async def _accepted(auth: Authenticator, token: str) -> bool:
    try:
        await auth.authenticate(f"Bearer {token}")
    except GatewayError as refused:
        assert refused.status_code in (401, 503), refused.status_code
        return False
    return True


async def test_a_verified_key_survives_an_outage_for_the_grace_and_a_revocation_lands(
    partition: Partition,
) -> None:
    org = f"org-outage-{time.monotonic_ns()}"
    await partition.admin.create_org(org)
    token, record = await partition.admin.create_key(org)
    never_seen, _ = await partition.admin.create_key(org)
    async with authenticator(partition.gateway, outage_grace_s=GRACE_S) as auth:
        assert await _accepted(auth, token)
        partition.forwarder.sever()
        cut_at = time.monotonic()
        # A poll already on the wire may still read the epoch; the next ones cannot.
        await asyncio.sleep(POLL_S * 3)
        await partition.admin.revoke_key(record.key_id)  # during the outage
        # Within the grace, the key this replica verified keeps working; a key it never
        # verified cannot be vouched for.
        await asyncio.sleep(STALENESS_S)
        assert await _accepted(auth, token)
        with pytest.raises(GatewayError) as unknown:
            await auth.authenticate(f"Bearer {never_seen}")
        assert unknown.value.status_code == 503
        # Past the grace (counted from the last successful poll), it stops.
        while time.monotonic() - cut_at < GRACE_S + POLL_S:
            await asyncio.sleep(0.05)
        assert not await _accepted(auth, token)
        # Redis answers again: the revocation applies within the normal bound.
        partition.forwarder.cut = False
        back_at = time.monotonic()
        while await _accepted(auth, token):
            assert time.monotonic() - back_at < 1.0 + 1.0, "revocation not applied after Redis"
            await asyncio.sleep(0.05)
        assert await _accepted(auth, never_seen)


async def test_without_a_grace_an_outage_fails_closed(partition: Partition) -> None:
    org = f"org-closed-{time.monotonic_ns()}"
    await partition.admin.create_org(org)
    token, _ = await partition.admin.create_key(org)
    async with authenticator(partition.gateway) as auth:
        assert await _accepted(auth, token)
        partition.forwarder.sever()
        await asyncio.sleep(STALENESS_S * 2)
        with pytest.raises(GatewayError) as refused:
            await auth.authenticate(f"Bearer {token}")
        assert refused.value.status_code == 503
        assert refused.value.code == "auth_unavailable"
