"""API keys: admin API and `cstack keys`, hashed storage, revocation across replicas."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import httpx
import pytest
from redis.asyncio import Redis

from tests.support.gateway import ADMIN_TOKEN, GatewayServer, cstack_keys
from tests.support.waits import wait_until

ADMIN = {"authorization": f"Bearer {ADMIN_TOKEN}"}


@pytest.fixture(scope="module")
def replicas(
    start_gateway: Callable[..., GatewayServer], vllm_url: str
) -> tuple[GatewayServer, GatewayServer]:
    """Two gateway replicas sharing one Redis, as in production."""
    return start_gateway(upstream_url=vllm_url), start_gateway(upstream_url=vllm_url)


def bearer(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


def test_admin_api_needs_its_own_token(
    start_gateway: Callable[..., GatewayServer],
    replicas: tuple[GatewayServer, GatewayServer],
    api_key: str,
) -> None:
    internal = replicas[0].internal_url
    assert httpx.post(f"{internal}/admin/orgs", json={"org_id": "x"}).status_code == 401
    wrong = httpx.post(f"{internal}/admin/orgs", json={"org_id": "x"}, headers=bearer(api_key))
    assert wrong.status_code == 401 and wrong.json()["error"]["code"] == "invalid_admin_token"
    closed = start_gateway(admin_token=None)
    refused = httpx.get(f"{closed.internal_url}/admin/orgs/acme", headers=ADMIN)
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "admin_disabled"


def test_admin_create_list_revoke_across_replicas(
    replicas: tuple[GatewayServer, GatewayServer], redis_url: str
) -> None:
    first, second = replicas
    org = httpx.post(
        f"{first.internal_url}/admin/orgs", json={"org_id": "globex", "plan": "pro"}, headers=ADMIN
    )
    assert org.status_code == 201 and org.json()["plan"] == "pro"
    admin = first.internal_url
    duplicate = httpx.post(f"{admin}/admin/orgs", json={"org_id": "globex"}, headers=ADMIN)
    assert duplicate.status_code == 409
    bad = httpx.post(f"{admin}/admin/orgs", json={"org_id": "no spaces"}, headers=ADMIN)
    assert bad.status_code == 400 and "invalid org id" in bad.json()["error"]["message"]
    assert httpx.post(f"{admin}/admin/orgs/nobody/keys", headers=ADMIN).status_code == 404

    created = httpx.post(
        f"{first.internal_url}/admin/orgs/globex/keys", json={"name": "ci"}, headers=ADMIN
    ).json()
    key, key_id = created["key"], created["key_id"]
    assert created["plan"] == "pro" and key.startswith("sk-cs-")
    listed = httpx.get(f"{second.internal_url}/admin/orgs/globex/keys", headers=ADMIN).json()[
        "data"
    ]
    assert [entry["key_id"] for entry in listed] == [key_id]
    assert "key" not in listed[0] and "digest" not in listed[0]
    assert_not_stored_in_plaintext(redis_url, key)

    # Both replicas have the key in their cache before it is revoked.
    for replica in replicas:
        assert httpx.get(f"{replica.url}/v1/models", headers=bearer(key)).status_code == 200
    revoked = httpx.post(f"{first.internal_url}/admin/keys/{key_id}/revoke", headers=ADMIN)
    assert revoked.status_code == 200 and revoked.json()["revoked_at"] is not None
    assert httpx.get(f"{first.url}/v1/models", headers=bearer(key)).status_code == 401
    # The other replica learns of it through Redis: poll, bounded by the 1 s contract.
    wait_until(
        lambda: httpx.get(f"{second.url}/v1/models", headers=bearer(key)).status_code == 401,
        "the other replica to refuse the revoked key",
        timeout_s=1.0,
        interval_s=0.02,
    )
    unknown = httpx.post(f"{first.internal_url}/admin/keys/0123456789abcdef/revoke", headers=ADMIN)
    assert unknown.status_code == 404


def assert_not_stored_in_plaintext(redis_url: str, key: str) -> None:
    secret = key.split(".", 1)[1]

    async def scan() -> list[bytes]:
        redis = Redis.from_url(redis_url)
        try:
            values: list[bytes] = []
            async for name in redis.scan_iter("cstack:*"):
                kind = await redis.type(name)
                if kind == b"hash":
                    values += list((await redis.hgetall(name)).values())
                elif kind == b"string":
                    values.append(await redis.get(name))
                elif kind == b"set":
                    values += list(await redis.smembers(name))
            return values
        finally:
            await redis.aclose()  # type: ignore[attr-defined]

    assert all(secret.encode() not in value for value in asyncio.run(scan()))


def test_cli_create_list_revoke(
    replicas: tuple[GatewayServer, GatewayServer], redis_url: str
) -> None:
    gateway = replicas[1]
    created = cstack_keys(redis_url, "create", "--org", "initech", "--plan", "team")
    assert created.exit_code == 0, created.output
    fields = dict(line.split(": ", 1) for line in created.stdout.splitlines())
    key, key_id = fields["key"], fields["key_id"]
    assert fields["org"] == "initech" and fields["plan"] == "team"
    assert httpx.get(f"{gateway.url}/v1/models", headers=bearer(key)).status_code == 200

    listed = cstack_keys(redis_url, "list", "--org", "initech")
    assert listed.exit_code == 0 and f"{key_id}\tactive\tteam" in listed.stdout
    assert key.split(".", 1)[1] not in listed.stdout

    revoked = cstack_keys(redis_url, "revoke", key_id)
    assert revoked.exit_code == 0 and key_id in revoked.stdout
    wait_until(
        lambda: httpx.get(f"{gateway.url}/v1/models", headers=bearer(key)).status_code == 401,
        "the revoked key to be refused",
        timeout_s=1.0,
        interval_s=0,
    )
    assert f"{key_id}\trevoked" in cstack_keys(redis_url, "list", "--org", "initech").stdout

    missing = cstack_keys(redis_url, "revoke", "0123456789abcdef")
    assert missing.exit_code == 1
    assert missing.stderr.strip() == "error: unknown key '0123456789abcdef'"


def test_cli_reports_unreachable_redis_in_one_line() -> None:
    result = cstack_keys("redis://127.0.0.1:1/0", "list", "--org", "acme")
    assert result.exit_code == 1
    assert (
        result.stderr.startswith("error: cannot reach Redis") and "Traceback" not in result.stderr
    )
