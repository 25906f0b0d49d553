"""DCP resume is exact, the HF export of a sharded run loads in transformers, and rank 0
serves the trainer metrics."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
import torch

from serving.process import free_port
from tests.support.spawn import run_ranks
from training.distributed.config import ParallelConfig
from training.models.deepseek_v3.config import ModelConfig
from training.models.deepseek_v3.model import DeepseekV3Model
from training.optim.config import MuonConfig
from training.trainer.config import TrainerConfig
from training.trainer.loop import Trainer

SMALL = ModelConfig(
    vocab_size=64, hidden_size=32, intermediate_size=48, moe_intermediate_size=16,
    num_hidden_layers=2, first_k_dense_replace=1, num_attention_heads=2, q_lora_rank=16,
    kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=8,
    n_routed_experts=4, num_experts_per_tok=2, max_position_embeddings=64,
)  # fmt: skip


def _config(steps: int, world: int, **extra: object) -> TrainerConfig:
    return TrainerConfig(
        model=SMALL, batch_size=4, seq_len=8, steps=steps, seed=5, log_every=0,
        optimizer=MuonConfig(lr=0.05, adamw_lr=0.01),
        parallel=ParallelConfig(world_size=world, dp_shard=2, ep=2),
        **extra,  # type: ignore[arg-type]
    )  # fmt: skip


def _full_state(trainer: Trainer) -> dict[str, torch.Tensor]:
    return {
        name: (value.full_tensor() if hasattr(value, "full_tensor") else value).detach().clone()
        for name, value in trainer.model.state_dict().items()
    }


def _worker(rank: int, world: int, tmp: Path, metrics_port: int) -> None:
    from prometheus_client import REGISTRY

    # Ranks are forked from pytest, whose registry may already count earlier tests' steps.
    steps_before = REGISTRY.get_sample_value("cstack_trainer_step_seconds_count") or 0.0
    straight = Trainer(_config(3, world, metrics_port=metrics_port))
    losses = [s.loss for s in straight.fit()]
    final = _full_state(straight)
    if rank == 0:
        # Rank 0 serves the contract's trainer metrics over real HTTP.
        text = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics").text
        assert "cstack_trainer_step 3.0" in text
        assert f"cstack_trainer_loss {losses[2]}" in text
        for name in (f"cstack_trainer_step_seconds_count {steps_before + 3}",
                     "cstack_trainer_tokens_per_second",
                     "cstack_trainer_last_step_timestamp_seconds"):  # fmt: skip
            assert name in text, name

    first = Trainer(_config(2, world, checkpoint_dir=tmp / "ckpt"))
    first.fit()
    resumed = Trainer(_config(3, world, checkpoint_dir=tmp / "ckpt", export_dir=tmp / "hf"))
    assert resumed.step == 2
    history = resumed.fit()
    assert [s.step for s in history] == [3]
    assert history[0].loss == losses[2], (history[0].loss, losses)
    for name, value in _full_state(resumed).items():
        assert torch.equal(value, final[name]), name


@pytest.mark.distributed
def test_resume_gives_the_same_next_loss_and_export_loads(tmp_path: Path) -> None:
    from transformers import DeepseekV3ForCausalLM

    run_ranks(_worker, 2, tmp_path, free_port())
    ids = torch.randint(0, SMALL.vocab_size, (2, 8), generator=torch.Generator().manual_seed(0))
    ours = DeepseekV3Model.from_pretrained(tmp_path / "hf").eval()
    hf = DeepseekV3ForCausalLM.from_pretrained(tmp_path / "hf", dtype=torch.float32).eval()
    with torch.no_grad():
        a, b = ours(ids), hf(ids).logits
    assert float((a - b).norm() / b.norm()) <= 1e-5
