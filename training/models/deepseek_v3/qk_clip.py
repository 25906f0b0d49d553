"""QK-clip (the "Clip" of Kimi K2's MuonClip) for multi-head latent attention.

Muon lets attention logits grow without bound in some heads; Kimi K2 caps them by
rescaling, after each optimizer step, the query and key weights of every head ``h`` whose
largest pre-softmax logit in that step, S_h, exceeds ``tau``: gamma_h = tau / S_h.
In MLA a head's logit is q_nope . k_nope + q_rope . k_rope, where k_rope is one rotary key
shared by all heads. So the head's own parts take the factor: q_nope and k_nope by
sqrt(gamma_h) each, q_rope by gamma_h, and the shared k_rope (``kv_a_proj_with_mqa``'s last
channels) is left alone; every logit of the head is then multiplied by exactly gamma_h,
and S_h becomes tau. The parts are rows of the projections: head h's rows of
``q_b_proj`` (or ``q_proj``) are [nope | rope] (``qk_head_dim`` rows per head) and its rows
of ``kv_b_proj`` are [k_nope | v]; values are not touched.

Weights may be FSDP2 DTensors sharded by rows; each rank scales the rows it holds, with
the same factors everywhere because the logits are reduced (MAX) over all ranks first.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor, nn

from training.models.deepseek_v3.attention import MLAttention
from training.optim.shard_plan import shard_rows


def attention_layers(model: nn.Module) -> list[MLAttention]:
    return [m for m in model.modules() if isinstance(m, MLAttention)]


@torch.no_grad()
def take_max_logits(model: nn.Module, group: dist.ProcessGroup | None) -> Tensor:
    """[layers, heads] largest logit per head since the last call, over ``group``'s ranks
    (every rank that saw other tokens); resets the trackers."""
    layers = attention_layers(model)
    logits = torch.stack([layer.max_logits.clone() for layer in layers])
    if group is not None:
        dist.all_reduce(logits, op=dist.ReduceOp.MAX, group=group)
    for layer in layers:
        layer.max_logits.fill_(float("-inf"))
    return logits


def clip_factors(max_logits: Tensor, tau: float) -> Tensor:
    """gamma per head: tau / max logit where it exceeds tau, else 1."""
    return torch.where(max_logits > tau, tau / max_logits, torch.ones_like(max_logits))


@torch.no_grad()
def qk_clip(model: nn.Module, max_logits: Tensor, tau: float) -> int:
    """Rescale the q/k weights of heads above ``tau``; returns how many heads were clipped."""
    clipped = 0
    for layer, logits in zip(attention_layers(model), max_logits, strict=True):
        gamma = clip_factors(logits.float(), tau)
        if bool((gamma == 1).all()):
            continue
        clipped += int((gamma < 1).sum())
        cfg = layer.config
        root = gamma.sqrt()
        q_rows = torch.cat(
            [
                root[:, None].expand(-1, cfg.qk_nope_head_dim),
                gamma[:, None].expand(-1, cfg.qk_rope_head_dim),
            ],
            dim=1,
        )
        kv_rows = torch.cat(
            [
                root[:, None].expand(-1, cfg.qk_nope_head_dim),
                gamma.new_ones(len(gamma), cfg.v_head_dim),
            ],
            dim=1,
        )
        q_proj = layer.q_proj if cfg.q_lora_rank is None else layer.q_b_proj
        scale_rows(q_proj.weight, q_rows.reshape(-1))
        scale_rows(layer.kv_b_proj.weight, kv_rows.reshape(-1))
    return clipped


def scale_rows(param: Tensor, factors: Tensor) -> None:
    """Multiply row ``i`` of the full ``param`` by ``factors[i]``, on this rank's rows only
    when ``param`` is a DTensor sharded by rows."""
    local = param.to_local() if hasattr(param, "to_local") else param
    start, end = 0, param.shape[0]
    for dim, placement in enumerate(getattr(param, "placements", ())):
        if placement.is_shard():
            mesh = param.device_mesh  # type: ignore[attr-defined]
            start, end = shard_rows(param.shape[0], mesh.size(dim), mesh.get_local_rank(dim))
    local.mul_(factors[start:end].to(local.device, local.dtype)[:, None])
