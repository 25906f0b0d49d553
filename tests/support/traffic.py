"""Paced chat traffic for the fault tests: requests of varied shapes sent at a fixed rate
while something else (a crash, a failover) happens alongside."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from dataclasses import dataclass, field

import httpx


@dataclass
class Outcome:
    """What the traffic got: the ids of answered requests, and every other answer."""

    answered: list[str] = field(default_factory=list)
    #: Status and error code of each request not answered (status 0: no answer at all).
    others: list[tuple[int, str]] = field(default_factory=list)

    @property
    def sent(self) -> int:
        return len(self.answered) + len(self.others)


async def paced_chat(
    base_url: str, token: str, requests: int, rate_per_s: float, alongside: Awaitable[None]
) -> Outcome:
    """Send ``requests`` chat completions (prompt and ``max_tokens`` varying) at
    ``rate_per_s`` to the gateway at ``base_url`` while ``alongside`` runs."""
    outcome = Outcome()
    headers = {"authorization": f"Bearer {token}"}

    async def one(client: httpx.AsyncClient, n: int) -> None:
        body = {
            "model": "composer-2.5",
            "messages": [{"role": "user", "content": f"request {n} " + "x" * (n % 50)}],
            "max_tokens": 4 + n % 60,
        }
        try:
            response = await client.post(
                f"{base_url}/v1/chat/completions", json=body, headers=headers
            )
        except httpx.HTTPError:
            outcome.others.append((0, "no answer"))
            return
        if response.status_code == 200:
            outcome.answered.append(response.headers["x-request-id"])
        else:
            outcome.others.append((response.status_code, response.json()["error"].get("code")))

    async with httpx.AsyncClient(timeout=60) as client:
        started = time.monotonic()
        tasks = [asyncio.ensure_future(alongside)]
        for n in range(requests):
            delay = started + n / rate_per_s - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(client, n)))
        await asyncio.gather(*tasks)
    return outcome
