"""Console sessions: a random id in an HttpOnly cookie, the session itself in Redis.

Signing in with an API key (or, on the operators' console, the admin token) creates a
session; the key itself is never stored, only the key id and org it proved. The cookie
holds a 256-bit random id; Redis holds the session under the id's SHA-256 (a copy of
Redis does not hand out live sessions), with the session's expiry as the key's TTL. Each
session carries its own CSRF token, which every form of that session must send back.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import time
from dataclasses import asdict, dataclass

from redis.asyncio import Redis
from starlette.requests import Request
from starlette.responses import Response

#: How long a session lasts from sign-in, whatever its use (an absolute expiry).
SESSION_TTL_S = 8 * 3600


@dataclass(frozen=True)
class Session:
    #: The signed-in API key's id and org; empty on an operator's session.
    key_id: str
    org_id: str
    csrf: str
    expires_at: float


@dataclass(frozen=True)
class CookieJar:
    """Where one console keeps its cookies: the session's and the sign-in form's CSRF."""

    session: str
    sign_in_csrf: str
    path: str


def is_https(request: Request) -> bool:
    """Behind a TLS-terminating proxy the scheme arrives as ``x-forwarded-proto`` (trusting a
    client's claim here can only make the cookie stricter)."""
    forwarded = request.headers.get("x-forwarded-proto", "").split(",")[0].strip()
    return request.url.scheme == "https" or forwarded == "https"


def set_cookie(
    response: Response, request: Request, name: str, value: str, path: str, max_age: int
) -> None:
    response.set_cookie(
        name,
        value,
        max_age=max_age,
        path=path,
        httponly=True,
        samesite="strict",
        secure=is_https(request),
    )


def same_token(sent: str | None, expected: str) -> bool:
    return bool(sent) and hmac.compare_digest((sent or "").encode(), expected.encode())


class SessionStore:
    """Sessions of one console (``prefix`` keeps the customers' and operators' apart)."""

    def __init__(self, redis: Redis, prefix: str, ttl_s: int = SESSION_TTL_S) -> None:
        self._redis = redis
        self._prefix = prefix
        self.ttl_s = ttl_s

    def _key(self, session_id: str) -> str:
        return self._prefix + hashlib.sha256(session_id.encode()).hexdigest()

    async def create(self, key_id: str, org_id: str) -> tuple[str, Session]:
        """A new session: ``(the cookie's id, the session)``."""
        session_id = secrets.token_urlsafe(32)
        session = Session(key_id, org_id, secrets.token_urlsafe(32), time.time() + self.ttl_s)
        await self._redis.set(self._key(session_id), json.dumps(asdict(session)), ex=self.ttl_s)
        return session_id, session

    async def get(self, session_id: str | None) -> Session | None:
        if not session_id or len(session_id) > 100:
            return None
        raw = await self._redis.get(self._key(session_id))
        if raw is None:
            return None
        session = Session(**json.loads(raw))
        # Redis expires the key; the check covers a key whose TTL was lost (a restore).
        return session if session.expires_at > time.time() else None

    async def delete(self, session_id: str | None) -> None:
        if session_id:
            await self._redis.delete(self._key(session_id))
