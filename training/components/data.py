"""Deterministic batches: the batch of step ``s`` depends only on (data, seed, s).

That is what makes a resumed run see exactly the batches an uninterrupted run would, with
no data-loader state in the checkpoint. Every rank builds the same global batch; the
trainer cuts out its own samples and sequence chunk.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from training.components.losses import IGNORE_INDEX


class TokenStream:
    """Documents tokenised and joined with EOS into one stream; windows sampled per step."""

    def __init__(self, tokens: Tensor, vocab_size: int, seed: int) -> None:
        self.tokens = tokens
        self.vocab_size = vocab_size
        self.seed = seed

    @classmethod
    def from_jsonl(
        cls, path: Path, model_path: Path | None, vocab_size: int, seed: int
    ) -> TokenStream:
        ids: list[int] = []
        tokenizer: Any = None
        eos: int | None = None
        for line_no, line in enumerate(path.read_text().splitlines(), start=1):
            if not line.strip():
                continue
            record = json.loads(line)
            if "input_ids" in record:
                ids.extend(int(t) for t in record["input_ids"])
            elif "text" in record:
                if tokenizer is None:
                    tokenizer, eos = _tokenizer(model_path, path)
                ids.extend(tokenizer.encode(record["text"]).ids)
            else:
                raise ValueError(f"{path}:{line_no}: a record needs 'text' or 'input_ids'")
            if eos is not None:
                ids.append(eos)
        if not ids:
            raise ValueError(f"{path} holds no tokens")
        tokens = torch.tensor(ids, dtype=torch.long)
        if int(tokens.max()) >= vocab_size or int(tokens.min()) < 0:
            raise ValueError(f"{path}: token ids outside the vocabulary [0, {vocab_size})")
        return cls(tokens, vocab_size, seed)

    def batch(self, step: int, batch_size: int, seq_len: int) -> dict[str, Tensor]:
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + step)
        span = seq_len + 1
        if self.tokens.numel() >= span:
            starts = torch.randint(0, self.tokens.numel() - span + 1, (batch_size,), generator=gen)
            windows = torch.stack([self.tokens[s : s + span] for s in starts.tolist()])
        else:
            windows = torch.full((batch_size, span), IGNORE_INDEX, dtype=torch.long)
            windows[:, : self.tokens.numel()] = self.tokens
        inputs = windows[:, :-1].clamp(min=0)
        return {"input_ids": inputs, "labels": windows[:, 1:]}


class RandomTokens:
    """Uniform random tokens: for smoke runs and benchmarks without a corpus."""

    def __init__(self, vocab_size: int, seed: int) -> None:
        self.vocab_size = vocab_size
        self.seed = seed

    def batch(self, step: int, batch_size: int, seq_len: int) -> dict[str, Tensor]:
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + step)
        windows = torch.randint(0, self.vocab_size, (batch_size, seq_len + 1), generator=gen)
        return {"input_ids": windows[:, :-1], "labels": windows[:, 1:]}


def _tokenizer(model_path: Path | None, data_path: Path) -> tuple[Any, int | None]:
    from tokenizers import Tokenizer

    if model_path is None or not (model_path / "tokenizer.json").is_file():
        raise ValueError(f"{data_path} has 'text' records but the model has no tokenizer.json")
    tokenizer = Tokenizer.from_file(str(model_path / "tokenizer.json"))
    eos_id = None
    config = model_path / "generation_config.json"
    if config.is_file():
        eos_id = json.loads(config.read_text()).get("eos_token_id")
    return tokenizer, eos_id
