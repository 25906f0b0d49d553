"""The fast variant's speculative decoding drafts with the checkpoint's MTP layer on vLLM's
CPU build, and an RL weight push reaches the drafter, not only the target model.

The engine is the fast variant with its speculative configuration (the CPU profile drops
it otherwise) and weight sync. The tiny checkpoint's MTP layer is random: it drafts, and
the target rejects nearly every draft. The trainer's MTP loss then teaches the layer the
engine's own greedy continuations, and the push carries it into the running engine with
the base model around it (so the target model, whose continuations the layer learnt, is
bit for bit the same); the drafts are then accepted. vLLM's plain ``reload_weights``
reloads the target model only (training/rl/rollouts/vllm_extension.py): with it, the second
measurement would still be the random layer's (0 of 184 drafted tokens accepted).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis
import torch

from serving.engine import engine_for_variant
from serving.process import free_port
from serving.spec_decode import greedy_counters
from training.components.checkpoint import graft_mtp_layers
from training.components.losses import IGNORE_INDEX
from training.models.deepseek_v3.hf_io import read_hf_tensors
from training.optim.config import MuonConfig
from training.trainer.config import TrainerConfig
from training.trainer.loop import Trainer

PROMPTS = [[1, 40, 300, 77, 512], [9, 123, 600, 5], [250, 31, 88, 410, 7, 61], [2, 333, 44]]
MAX_TOKENS = 24


@pytest.fixture(scope="module")
def fast_engine_url(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    engine = engine_for_variant(
        "fast", tiny_model, free_port(), log_path=tmp_path_factory.mktemp("logs") / "fast.log",
        weight_sync=True, eager=True, speculative=True,
    )  # fmt: skip
    engine.start()
    try:
        engine.wait_healthy(timeout_s=900)
        yield engine.base_url
    finally:
        engine.stop()


def _target_digests(url: str) -> dict[str, str]:
    """vLLM's digest of every target-model weight (the drafter's are not among them)."""
    reply = httpx.post(f"{url}/weight_checker", json={"action": "checksum"}, timeout=120)
    reply.raise_for_status()
    return dict(reply.json()["checksums"])


def _train_mtp(tiny_model: Path, completions: list[list[int]], out: Path) -> Path:
    """Trainer steps on prompt + completion rows (losses on the completions), exported. One
    step teaches the random MTP layer little on its own (the trunk learns most of it):
    four take the layer alone to about half of the next-but-one tokens (fp32, offline)."""
    width = max(len(p) + len(c) for p, c in zip(PROMPTS, completions, strict=True))
    input_ids = torch.zeros(len(PROMPTS), width, dtype=torch.long)
    labels = torch.full_like(input_ids, IGNORE_INDEX)
    for row, (prompt, completion) in enumerate(zip(PROMPTS, completions, strict=True)):
        tokens = prompt + completion
        input_ids[row, : len(tokens)] = torch.tensor(tokens)
        labels[row, len(prompt) - 1 : len(tokens) - 1] = torch.tensor(completion)
    trainer = Trainer(
        TrainerConfig(model_path=tiny_model, batch_size=len(PROMPTS), seq_len=width,
                      log_every=0, mtp_loss_weight=0.3,
                      optimizer=MuonConfig(lr=0.02, adamw_lr=0.002))
    )  # fmt: skip
    losses = [trainer.train_step({"input_ids": input_ids, "labels": labels}).mtp_loss
              for _ in range(4)]  # fmt: skip
    assert losses[-1] is not None and losses[0] is not None and losses[-1] < losses[0]
    trainer.export(out)
    return out


@pytest.mark.vllm
def test_pushed_mtp_layer_drafts_in_the_fast_engine(
    fast_engine_url: str, redis_url: str, tiny_model: Path, tmp_path: Path, process_group: None
) -> None:
    from training.rl.rollouts.gate import PolicyVersionGate
    from training.rl.rollouts.weight_sync import VllmWeightSync

    target = _target_digests(fast_engine_url)
    random_layer, completions = greedy_counters(fast_engine_url, PROMPTS, MAX_TOKENS)
    assert random_layer.draft_tokens > 0  # the CPU build drafts with the MTP layer
    assert random_layer.acceptance_rate < 0.1

    trained = _train_mtp(tiny_model, completions, tmp_path / "trained")
    pushed = graft_mtp_layers(tiny_model, trained, tmp_path / "base-with-trained-mtp")
    gate = PolicyVersionGate(redis.Redis.from_url(redis_url), prefix=f"mtp-{uuid.uuid4().hex}")
    VllmWeightSync([fast_engine_url], gate).push(pushed)

    # The target model is the one the completions came from; only the drafter changed.
    assert _target_digests(fast_engine_url) == target
    trained_layer, _ = greedy_counters(fast_engine_url, PROMPTS, MAX_TOKENS)
    assert trained_layer.acceptance_rate > 0.2, trained_layer

    # A streamed push (no disk: weight_transport.py) reaches the drafter too: the random
    # layer comes back, then the trained one drafts exactly as after the disk push.
    sync = VllmWeightSync([fast_engine_url], gate, bucket_bytes=2**20)
    sync.push_weights(read_hf_tensors(tiny_model))
    assert greedy_counters(fast_engine_url, PROMPTS, MAX_TOKENS)[0] == random_layer
    sync.push_weights(read_hf_tensors(pushed))
    assert _target_digests(fast_engine_url) == target
    assert greedy_counters(fast_engine_url, PROMPTS, MAX_TOKENS)[0] == trained_layer
