"""Launch-week traffic and its invoice worked out by hand, for the end-to-end tests
(``test_launch_week_e2e.py`` through gateway processes, ``tests/e2e/test_up_billing.py``
through `cstack up`).

``mixed_traffic`` sends requests of every shape (both tiers, streamed and not, ``n`` up
to 3, prompt lists) through the openai SDK: one after another until the org's allowance
is crossed (so their order is known) and two more, then six at once (all past it, so
their order does not matter). ``hand_invoice`` applies the published rule to what each
client was told it used, with the published prices: a promotion multiplies the
allowance (usage counts 1/2 against it) and nothing else; the requests take it in the
order they started, the crossing one is split, the rest is overage at list price. It
imports nothing of billing's: the expected invoice is not the code under test's.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from openai import AsyncOpenAI

#: The published prices in nano-USD per token (input, output); cached input is at the
#: input price in the launch price version.
PRICES = {"fast": (3000, 15000), "standard": (500, 2500)}
#: (endpoint, tier, stream, n), cycled.
SHAPES = [
    ("chat", "fast", False, 1),
    ("chat", "standard", True, 2),
    ("completions", "fast", False, 3),
    ("completions", "standard", True, 3),
    ("chat", "fast", True, 3),
    ("completions", "standard", False, 2),
]


async def send(client: AsyncOpenAI, number: int) -> dict[str, Any]:
    """One request of the ``number``th shape; what its client was told: tokens and cost."""
    endpoint, tier, stream, n = SHAPES[number % len(SHAPES)]
    # Long enough answers that the invoice's lines are cents, not fractions of one.
    common: dict[str, Any] = {"model": f"composer-2.5-{tier}", "n": n, "max_tokens": 160,
                              "seed": number, "temperature": 1.0}  # fmt: skip
    if stream:
        common |= {"stream": True, "stream_options": {"include_usage": True}}
    if endpoint == "chat":
        messages = [{"role": "user", "content": f"Tell me about {number}."}]
        answer = await client.chat.completions.create(messages=messages, **common)
    else:
        prompt = [f"Once upon {number}", "The end"] if number % 2 else f"Number {number}:"
        answer = await client.completions.create(prompt=prompt, **common)
    if stream:
        chunks = [chunk async for chunk in answer]  # type: ignore[union-attr]
        usage, response_id = chunks[-1].usage, chunks[-1].id
    else:
        usage, response_id = answer.usage, answer.id  # type: ignore[union-attr]
    assert usage is not None
    details = usage.prompt_tokens_details
    return {
        "id": response_id,
        "tier": tier,
        "prompt": usage.prompt_tokens,
        "cached": (details.cached_tokens or 0) if details else 0,
        "completion": usage.completion_tokens,
        "cost": (usage.model_extra or {}).get("cstack_cost"),
    }


def list_cost(request: dict[str, Any]) -> int:
    price_in, price_out = PRICES[request["tier"]]
    return request["prompt"] * price_in + request["completion"] * price_out


async def mixed_traffic(client: AsyncOpenAI, included: int) -> list[dict[str, Any]]:
    """Requests crossing ``included`` (nano-USD of allowance) at half their list cost."""
    in_order: list[dict[str, Any]] = []
    allowance_cost = 0
    while allowance_cost <= included or len(in_order) < len(SHAPES):
        request = await send(client, len(in_order))
        in_order.append(request)
        allowance_cost += list_cost(request) // 2
    in_order += [await send(client, len(in_order)) for _ in range(2)]
    together = await asyncio.gather(*(send(client, len(in_order) + i) for i in range(6)))
    return in_order + list(together)


@dataclass
class HandInvoice:
    #: Invoice line key -> nano-USD.
    lines: dict[str, int]
    allowance: int
    covered: int
    overage: int
    #: The response id of the request the allowance ran out in (None: it ran out exactly).
    crossing: str | None

    @property
    def total_cents(self) -> int:
        """Each line rounded to cents once, half away from zero, then added up."""
        return sum(
            (abs(nano) + 5_000_000) // 10_000_000 * (1 if nano >= 0 else -1)
            for nano in self.lines.values()
        )


def hand_invoice(requests: list[dict[str, Any]], included: int, version: str) -> HandInvoice:
    left, allowance, covered, overage = included, 0, 0, 0
    crossing = None
    for request in requests:
        cost = list_cost(request)
        half = cost // 2
        if half <= left:
            allowance, covered, left = allowance + half, covered + cost, left - half
        elif left > 0:
            crossing = request["id"]
            allowance, covered, overage = (
                allowance + left,
                covered + 2 * left,
                overage + cost - 2 * left,
            )
            left = 0
        else:
            overage += cost
    lines: dict[str, int] = {}
    for tier, (price_in, price_out) in PRICES.items():
        mine = [r for r in requests if r["tier"] == tier]
        lines[f"{tier}.input.{version}"] = sum(r["prompt"] - r["cached"] for r in mine) * price_in
        lines[f"{tier}.cached_input.{version}"] = sum(r["cached"] for r in mine) * price_in
        lines[f"{tier}.output.{version}"] = sum(r["completion"] for r in mine) * price_out
    lines["promotion"] = -(covered - allowance)
    lines["allowance"] = -allowance
    return HandInvoice(
        lines={key: nano for key, nano in lines.items() if nano},
        allowance=allowance,
        covered=covered,
        overage=overage,
        crossing=crossing,
    )
