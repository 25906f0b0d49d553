"""An engine's speculative-decoding counters, read from its ``/metrics``.

vLLM counts drafting steps, the tokens drafted and the tokens the target model accepted,
in total and per draft position (``vllm:spec_decode_*``). Their difference between two
reads is what the requests in between did: the acceptance rate of the drafter (for the
fast variant, the checkpoint's MTP layer) on that traffic.
"""

from __future__ import annotations

from dataclasses import dataclass

import httpx
from prometheus_client.parser import text_string_to_metric_families

_PREFIX = "vllm:spec_decode_"


@dataclass(frozen=True)
class SpecDecodeCounters:
    drafts: float = 0.0
    draft_tokens: float = 0.0
    accepted_tokens: float = 0.0
    #: Accepted tokens at each draft position (0: the first drafted token).
    accepted_per_position: tuple[float, ...] = ()

    def __sub__(self, earlier: SpecDecodeCounters) -> SpecDecodeCounters:
        # An engine lists the positions once it has drafted.
        before = earlier.accepted_per_position or (0.0,) * len(self.accepted_per_position)
        return SpecDecodeCounters(
            self.drafts - earlier.drafts,
            self.draft_tokens - earlier.draft_tokens,
            self.accepted_tokens - earlier.accepted_tokens,
            tuple(a - b for a, b in zip(self.accepted_per_position, before, strict=True)),
        )

    @property
    def acceptance_rate(self) -> float:
        """Accepted over drafted tokens (0 when nothing was drafted)."""
        return self.accepted_tokens / self.draft_tokens if self.draft_tokens else 0.0

    @property
    def acceptance_per_position(self) -> tuple[float, ...]:
        """Per draft position, the share of drafting steps whose token there was accepted."""
        return tuple(a / self.drafts if self.drafts else 0.0 for a in self.accepted_per_position)


def read_counters(base_url: str, timeout_s: float = 30.0) -> SpecDecodeCounters:
    """The engine's counters now; all zero for an engine that does not draft."""
    text = httpx.get(f"{base_url.rstrip('/')}/metrics", timeout=timeout_s).text
    totals: dict[str, float] = {}
    positions: dict[int, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if not sample.name.startswith(_PREFIX) or not sample.name.endswith("_total"):
                continue
            name = sample.name[len(_PREFIX) : -len("_total")]
            if "position" in sample.labels:
                position = int(sample.labels["position"])
                positions[position] = positions.get(position, 0.0) + sample.value
            else:
                totals[name] = totals.get(name, 0.0) + sample.value
    return SpecDecodeCounters(
        drafts=totals.get("num_drafts", 0.0),
        draft_tokens=totals.get("num_draft_tokens", 0.0),
        accepted_tokens=totals.get("num_accepted_tokens", 0.0),
        accepted_per_position=tuple(positions[p] for p in sorted(positions)),
    )


def greedy_counters(
    base_url: str, prompts: list[list[int]], max_tokens: int, timeout_s: float = 600.0
) -> tuple[SpecDecodeCounters, list[list[int]]]:
    """Greedy completions of ``prompts`` (token ids, ``max_tokens`` each, EOS ignored) and
    the engine's drafting counters over just those requests."""
    before = read_counters(base_url)
    completions = []
    for prompt in prompts:
        body = {"model": "composer-2.5", "prompt": prompt, "max_tokens": max_tokens,
                "temperature": 0.0, "ignore_eos": True, "return_token_ids": True}  # fmt: skip
        reply = httpx.post(f"{base_url.rstrip('/')}/v1/completions", json=body, timeout=timeout_s)
        reply.raise_for_status()
        completions.append(list(reply.json()["choices"][0]["token_ids"]))
    return read_counters(base_url) - before, completions
