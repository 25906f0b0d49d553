"""A toy causal LM and word-level encoder for loss tests: small enough to reason about.

Logits at position t are the running mean of per-token logit vectors over ids[0..t], so
a hint token's vector shifts every later prediction by a known amount.
"""

from __future__ import annotations

import torch

WORDS = [
    "<pad>",
    "SYS",
    "END",
    "ASSIST",
    "USER",
    "tools",
    "read_file",
    "search",
    "finish",
    "ok",
    "notfound",
    "hello",
]
VOCAB = {word: i for i, word in enumerate(WORDS)}


def encode(text: str) -> list[int]:
    return [VOCAB[word] for word in text.split()]


class BagOfContextLM(torch.nn.Module):
    """logits[b, t] = mean(table[ids[b, :t+1]]): causal, so right padding is harmless."""

    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(seed)
        self.table = torch.nn.Parameter(torch.randn(len(WORDS), len(WORDS), generator=generator))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        vectors = self.table[ids]
        counts = torch.arange(1, ids.shape[1] + 1, dtype=vectors.dtype).view(1, -1, 1)
        return vectors.cumsum(dim=1) / counts
