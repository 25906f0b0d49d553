"""QK-clip on MLA: a head driven above tau comes back to tau with exactly Kimi's factors
(q_nope and k_nope by sqrt(gamma), q_rope by gamma, the shared rotary key untouched),
other heads stay bit-identical, and the sharded trainer clips as one process does."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import Tensor

from tests.support.spawn import run_ranks
from training.components.data import RandomTokens
from training.components.losses import cross_entropy_loss
from training.distributed.config import ParallelConfig
from training.models.deepseek_v3.attention import MLAttention
from training.models.deepseek_v3.config import ModelConfig
from training.models.deepseek_v3.model import DeepseekV3Model
from training.models.deepseek_v3.moe import update_routing_bias
from training.models.deepseek_v3.qk_clip import qk_clip, take_max_logits
from training.optim.config import MuonConfig, NewtonSchulzConfig
from training.optim.muon import build_optimizer
from training.trainer.config import TrainerConfig
from training.trainer.loop import Trainer

SMALL = ModelConfig(
    vocab_size=64, hidden_size=32, intermediate_size=48, moe_intermediate_size=16,
    num_hidden_layers=2, first_k_dense_replace=1, num_attention_heads=2, q_lora_rank=16,
    kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=8,
    n_routed_experts=4, num_experts_per_tok=2, max_position_embeddings=64,
)  # fmt: skip


def _rms(x: Tensor, weight: Tensor, eps: float = 1e-6) -> Tensor:
    return weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def _rotate_pairs(x: Tensor, positions: Tensor, theta: float) -> Tensor:
    """Rotate pairs (x[2i], x[2i+1]) by position * theta^(-2i/d); [b, (h,) s, d]."""
    d = x.shape[-1]
    angles = positions[..., None].double() * theta ** (-torch.arange(0, d, 2).double() / d)
    if x.dim() == 4:
        angles = angles[:, None]
    cos, sin = angles.cos(), angles.sin()
    even, odd = x[..., 0::2], x[..., 1::2]
    return torch.stack([even * cos - odd * sin, odd * cos + even * sin], dim=-1).flatten(-2)


def _max_logits(attn: MLAttention, x: Tensor, positions: Tensor) -> Tensor:
    """Per head, the largest causal pre-softmax logit, from the weights in float64."""
    cfg = attn.config
    x = x.double()
    heads, nope, rope = cfg.num_attention_heads, cfg.qk_nope_head_dim, cfg.qk_rope_head_dim
    if cfg.q_lora_rank is None:
        q = x @ attn.q_proj.weight.double().T
    else:
        q_latent = _rms(x @ attn.q_a_proj.weight.double().T, attn.q_a_layernorm.weight.double())
        q = q_latent @ attn.q_b_proj.weight.double().T
    q = q.unflatten(-1, (heads, nope + rope)).transpose(1, 2)  # [b, h, s, nope+rope]
    kv_a = x @ attn.kv_a_proj_with_mqa.weight.double().T
    latent = _rms(kv_a[..., : cfg.kv_lora_rank], attn.kv_a_layernorm.weight.double())
    k_rope = _rotate_pairs(kv_a[..., cfg.kv_lora_rank :], positions, cfg.rope_theta)
    kv = (latent @ attn.kv_b_proj.weight.double().T).unflatten(-1, (heads, nope + cfg.v_head_dim))
    k_nope = kv[..., :nope].transpose(1, 2)
    q_rope = _rotate_pairs(q[..., nope:], positions, cfg.rope_theta)
    scores = q[..., :nope] @ k_nope.mT + q_rope @ k_rope[:, None].mT
    scores = scores * (nope + rope) ** -0.5
    causal = torch.ones(x.shape[1], x.shape[1], dtype=torch.bool).tril()
    return scores.masked_fill(~causal, float("-inf")).amax(dim=(0, 2, 3))


@torch.no_grad()
def _reference_logits(model: DeepseekV3Model, ids: Tensor) -> Tensor:
    """[layers, heads] from each layer's attention input, captured by hooks."""
    attns = [m for m in model.modules() if isinstance(m, MLAttention)]
    inputs: list[tuple[Tensor, Tensor]] = []
    hooks = [attn.register_forward_hook(lambda m, a, out: inputs.append(a)) for attn in attns]
    model(ids)
    for hook in hooks:
        hook.remove()
    return torch.stack([_max_logits(attn, *args) for attn, args in zip(attns, inputs, strict=True)])


@pytest.mark.parametrize("q_lora_rank", [16, None])
def test_a_head_above_tau_is_scaled_back_to_tau(q_lora_rank: int | None) -> None:
    config = dataclasses.replace(SMALL, q_lora_rank=q_lora_rank)
    model = DeepseekV3Model(config)
    model.init_weights(0)
    attn = [m for m in model.modules() if isinstance(m, MLAttention)][1]
    q_weight = (attn.q_proj if q_lora_rank is None else attn.q_b_proj).weight
    head_rows = slice(config.qk_head_dim, 2 * config.qk_head_dim)  # head 1: [nope | rope]
    with torch.no_grad():
        q_weight[head_rows] *= 300
    ids = torch.randint(0, config.vocab_size, (2, 16), generator=torch.Generator().manual_seed(1))

    model(ids)
    tracked = take_max_logits(model, None)
    before = _reference_logits(model, ids)
    torch.testing.assert_close(tracked.double(), before, rtol=1e-5, atol=1e-6)
    others = before.clone()
    others[1, 1] = float("-inf")
    tau = 2 * float(others.max())
    assert before[1, 1] > 2 * tau, "the boosted head must be far above tau"

    old = {name: p.detach().clone() for name, p in model.named_parameters()}
    assert qk_clip(model, tracked, tau) == 1
    after = _reference_logits(model, ids)
    assert after[1, 1] <= tau * (1 + 1e-5)
    torch.testing.assert_close(
        after[1, 1], torch.tensor(tau, dtype=torch.float64), rtol=1e-5, atol=0
    )
    torch.testing.assert_close(
        after, before.index_put((torch.tensor(1), torch.tensor(1)), after[1, 1])
    )

    gamma = tau / float(tracked[1, 1])
    nope, rope, v = config.qk_nope_head_dim, config.qk_rope_head_dim, config.v_head_dim
    q_name = "q_proj" if q_lora_rank is None else "q_b_proj"
    expected = {
        # Head 1's rows only: [nope | rope] of the query, [k_nope | v] of kv_b_proj.
        f"model.layers.1.self_attn.{q_name}.weight": [(head_rows.start, nope, gamma**0.5),
                                                       (head_rows.start + nope, rope, gamma)],
        "model.layers.1.self_attn.kv_b_proj.weight": [(nope + v, nope, gamma**0.5)],
    }  # fmt: skip
    for name, param in model.named_parameters():
        new, previous = param.detach(), old[name]
        untouched = torch.ones(new.shape[0], dtype=torch.bool)
        for start, rows, factor in expected.get(name, []):
            part = slice(start, start + rows)
            torch.testing.assert_close(
                new[part].double(), previous[part].double() * factor, rtol=1e-6, atol=0
            )
            untouched[part] = False
        # Everything else, the shared rotary key (kv_a_proj_with_mqa) and values included,
        # is bit-identical.
        assert torch.equal(new[untouched], previous[untouched]), name


def _step_reference(config: TrainerConfig, batch: dict[str, Tensor]) -> dict[str, Tensor]:
    model = DeepseekV3Model(SMALL)
    model.init_weights(config.seed)
    terms = cross_entropy_loss(model(batch["input_ids"]), batch)
    (terms.loss_sum / terms.tokens).backward()
    build_optimizer(model, config.optimizer).step()
    logits = take_max_logits(model, None)
    assert qk_clip(model, logits, config.optimizer.qk_clip_tau) == 4
    update_routing_bias(model, config.routing_bias_speed, None)
    return model.state_dict()


def _sharded_worker(rank: int, world: int) -> None:
    from prometheus_client import REGISTRY

    config = TrainerConfig(
        model=SMALL, batch_size=4, seq_len=8, steps=1, seed=3, grad_clip=1e9,
        # A tau every head exceeds: all four heads clipped, on row shards of FSDP2. Newton-
        # Schulz in float32: in float16 the sharded gradients' last-bit differences from the
        # reference's can flip a rounding of the update (test_parallel_step.py).
        optimizer=MuonConfig(lr=0.05, adamw_lr=0.01, qk_clip_tau=1e-3,
                             newton_schulz=NewtonSchulzConfig(dtype="float32")),
        parallel=ParallelConfig(world_size=world, dp_shard=2, ep=2),
    )  # fmt: skip
    batch = RandomTokens(SMALL.vocab_size, 0).batch(0, config.batch_size, config.seq_len)
    trainer = Trainer(config)
    stats = trainer.train_step(batch)
    assert stats.clipped_heads == 4 and stats.max_logit > 1e-3
    expected = _step_reference(config, batch)
    for name, value in trainer.model.state_dict().items():
        full = value.full_tensor() if hasattr(value, "full_tensor") else value
        torch.testing.assert_close(full, expected[name], rtol=1e-5, atol=1e-6, msg=name)
    if rank == 0:
        assert REGISTRY.get_sample_value("cstack_trainer_qk_clipped_heads") == 4
        assert REGISTRY.get_sample_value("cstack_trainer_max_attention_logit") == stats.max_logit


@pytest.mark.distributed
def test_sharded_trainer_clips_as_one_process() -> None:
    run_ranks(_sharded_worker, 2)
