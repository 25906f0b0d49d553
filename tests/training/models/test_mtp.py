"""DeepSeek-V3's multi-token-prediction (MTP) layers in the trainer: the MTP loss trains
them (and only when its weight is above 0), a sharded step computes what one process
does, and the layers leave the trainer exactly as the checkpoint had them when untrained."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.support.spawn import run_ranks
from training.components.data import RandomTokens
from training.components.losses import (
    IGNORE_INDEX,
    cross_entropy_loss,
    mtp_cross_entropy,
    mtp_inputs,
)
from training.distributed.config import ParallelConfig
from training.models.deepseek_v3.config import ModelConfig
from training.models.deepseek_v3.hf_io import read_hf_tensors
from training.models.deepseek_v3.model import DeepseekV3Model
from training.optim.config import MuonConfig
from training.trainer.config import TrainerConfig
from training.trainer.loop import Trainer

SMALL = ModelConfig(
    vocab_size=64, hidden_size=32, intermediate_size=48, moe_intermediate_size=16,
    num_hidden_layers=2, first_k_dense_replace=1, num_attention_heads=2, q_lora_rank=16,
    kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=8,
    n_routed_experts=4, num_experts_per_tok=2, max_position_embeddings=64,
    num_nextn_predict_layers=1,
)  # fmt: skip
MTP = "model.layers.2."


def test_mtp_inputs_read_and_predict_further_ahead() -> None:
    ids = torch.tensor([[10, 11, 12, 13, 14]])
    labels = torch.tensor([[11, 12, IGNORE_INDEX, 14, IGNORE_INDEX]])
    out = mtp_inputs(ids, labels, depths=2)
    # Depth k at position i reads token i+k and predicts token i+k+1 (labels moved by k).
    assert out["mtp_input_ids"][0].T.tolist() == [[11, 12, 13, 14, 0], [12, 13, 14, 0, 0]]
    ignore = IGNORE_INDEX
    assert out["mtp_labels"][0].T.tolist() == [
        [12, ignore, 14, ignore, ignore],
        [ignore, 14, ignore, ignore, ignore],
    ]


def _mtp_params(trainer: Trainer) -> dict[str, torch.Tensor]:
    return {
        name: param.detach().clone()
        for name, param in trainer.model.named_parameters()
        if name.startswith(MTP)
    }


def _tiny_worker(rank: int, world: int, tiny_model: Path, out: Path) -> None:
    batch = RandomTokens(ModelConfig.from_pretrained(tiny_model).vocab_size, 0).batch(0, 2, 16)
    config = TrainerConfig(
        model_path=tiny_model, batch_size=2, seq_len=16, log_every=0, mtp_loss_weight=0.3,
        optimizer=MuonConfig(lr=0.02, adamw_lr=0.002),
    )  # fmt: skip
    trainer = Trainer(config)
    before = _mtp_params(trainer)
    assert len(before) > 10  # norms, eh_proj and a whole MoE decoder block
    trainer.forward_backward(batch)
    assert trainer.mtp_loss is not None and 0 < trainer.mtp_loss < 20
    for name, param in trainer.model.named_parameters():
        if name.startswith(MTP):
            assert param.grad is not None and bool(param.grad.abs().sum() > 0), name
    trainer.optimizer_step()
    after = _mtp_params(trainer)
    assert all(not torch.equal(after[name], before[name]) for name in before)
    assert trainer.train_step(batch).mtp_loss is not None

    # Weight 0: no MTP forward, and the layer leaves the trainer as it came in.
    untrained = Trainer(dataclasses.replace(config, mtp_loss_weight=0.0))
    stats = untrained.train_step(batch)
    assert stats.mtp_loss is None
    for name, param in untrained.model.named_parameters():
        assert param.grad is None
        if name.startswith(MTP):
            assert torch.equal(param.detach(), before[name]), name
    untrained.export(out)
    # What a streamed weight push sends is what the export wrote, tensor for tensor.
    streamed, written = untrained.hf_weights(), read_hf_tensors(out)
    assert streamed.keys() == written.keys()
    for key, tensor in written.items():
        assert streamed[key].dtype == tensor.dtype and torch.equal(streamed[key], tensor), key


@pytest.mark.distributed
def test_mtp_loss_trains_the_mtp_layer_and_only_then(tiny_model: Path, tmp_path: Path) -> None:
    run_ranks(_tiny_worker, 1, tiny_model, tmp_path / "export")
    served = load_file(str(tiny_model / "model.safetensors"))
    exported = load_file(str(tmp_path / "export" / "model.safetensors"))
    assert exported.keys() == served.keys()
    for key, tensor in served.items():
        if key.startswith(MTP) and not key.endswith(("embed_tokens.weight", "head.weight")):
            assert torch.equal(exported[key], tensor), key
    # The layer's copies of the shared weights follow the trained main ones.
    assert torch.equal(exported[MTP + "shared_head.head.weight"], exported["lm_head.weight"])
    assert not torch.equal(exported["lm_head.weight"], served["lm_head.weight"])


def _reference(config: TrainerConfig, batch: dict[str, torch.Tensor]) -> dict[str, object]:
    model = DeepseekV3Model(SMALL)
    model.init_weights(config.seed)
    extra = mtp_inputs(batch["input_ids"], batch["labels"], depths=1)
    logits, mtp_logits = model(batch["input_ids"], None, extra["mtp_input_ids"])
    main = cross_entropy_loss(logits, batch)
    (mtp,) = mtp_cross_entropy(mtp_logits, extra)
    loss, mtp_loss = main.loss_sum / main.tokens, mtp.loss_sum / mtp.tokens
    (loss + config.mtp_loss_weight * mtp_loss).backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return {"loss": loss.item(), "mtp_loss": mtp_loss.item(), "grads": grads}


def _sharded_worker(rank: int, world: int) -> None:
    # Context parallel splits each sequence: the last position of rank 0's chunk must
    # read its MTP token from rank 1's chunk.
    config = TrainerConfig(
        model=SMALL, batch_size=4, seq_len=8, seed=3, mtp_loss_weight=0.3,
        parallel=ParallelConfig(world_size=world, dp_shard=2, cp=2, ep=2),
    )  # fmt: skip
    trainer = Trainer(config)
    batch = RandomTokens(SMALL.vocab_size, 3).batch(0, config.batch_size, config.seq_len)
    expected = _reference(config, batch)
    loss, _ = trainer.forward_backward(batch)
    assert loss == pytest.approx(expected["loss"], rel=1e-5)
    assert trainer.mtp_loss == pytest.approx(expected["mtp_loss"], rel=1e-5)
    grads = expected["grads"]
    assert isinstance(grads, dict) and any(name.startswith(MTP) for name in grads)
    for name, param in trainer.model.named_parameters():
        assert param.grad is not None, name
        grad = param.grad.full_tensor() if hasattr(param.grad, "full_tensor") else param.grad
        torch.testing.assert_close(grad, grads[name], rtol=1e-4, atol=1e-6, msg=name)
    trainer.optimizer_step()


@pytest.mark.distributed
def test_sharded_mtp_step_matches_one_process() -> None:
    run_ranks(_sharded_worker, 2)
