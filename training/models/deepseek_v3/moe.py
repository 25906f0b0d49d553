"""DeepSeek-V3 mixture of experts: sigmoid ``noaux_tc`` router, stacked experts, shared expert.

Routed experts are stored stacked (``gate_proj``/``up_proj`` [E, I, H], ``down_proj``
[E, H, I]) so per-expert optimizer work and expert-parallel sharding address them by the
leading dimension; checkpoints still store them per expert (``hf_io``). Routing adds
``e_score_correction_bias`` only for the choice of experts, never to the weights, and that
bias is moved by load (aux-loss-free balancing), not by gradients.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn

from training.distributed.expert_parallel import ExpertParallel
from training.models.deepseek_v3.config import ModelConfig


def local_tensor(param: Tensor) -> Tensor:
    """The rank-local part of a DTensor parameter (the tensor itself otherwise)."""
    to_local = getattr(param, "to_local", None)
    return to_local() if to_local is not None else param


class DenseMLP(nn.Module):
    def __init__(self, hidden: int, intermediate: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))  # type: ignore[no-any-return]


class Router(nn.Module):
    """Sigmoid scores, group-limited top-k on score + bias, weights from the raw scores."""

    e_score_correction_bias: Tensor

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.weight = nn.Parameter(torch.empty(config.n_routed_experts, config.hidden_size))
        self.register_buffer("e_score_correction_bias", torch.zeros(config.n_routed_experts))

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """``x`` [tokens, hidden] -> (weights [tokens, k], expert indices [tokens, k])."""
        cfg = self.config
        scores = F.linear(x.float(), self.weight.float()).sigmoid()
        choice = scores + self.e_score_correction_bias
        per_group = cfg.n_routed_experts // cfg.n_group
        group_scores = choice.view(-1, cfg.n_group, per_group).topk(2, dim=-1)[0].sum(dim=-1)
        groups = group_scores.topk(cfg.topk_group, dim=-1, sorted=False)[1]
        group_mask = torch.zeros_like(group_scores).scatter_(1, groups, 1.0)
        allowed = (
            group_mask.unsqueeze(-1).expand(-1, cfg.n_group, per_group).reshape(x.shape[0], -1)
        )
        choice = choice.masked_fill(allowed == 0, float("-inf"))
        indices = choice.topk(cfg.num_experts_per_tok, dim=-1, sorted=False)[1]
        weights = scores.gather(1, indices)
        if cfg.norm_topk_prob:
            weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
        return weights * cfg.routed_scaling_factor, indices


class RoutedExperts(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        e, i, h = config.n_routed_experts, config.moe_intermediate_size, config.hidden_size
        self.gate_proj = nn.Parameter(torch.empty(e, i, h))
        self.up_proj = nn.Parameter(torch.empty(e, i, h))
        self.down_proj = nn.Parameter(torch.empty(e, h, i))

    def forward(self, x: Tensor, counts: list[int]) -> Tensor:
        """``x`` rows grouped by local expert, ``counts[e]`` rows for local expert ``e``."""
        gate, up, down = (local_tensor(p) for p in (self.gate_proj, self.up_proj, self.down_proj))
        outputs = []
        for expert, rows in enumerate(x.split(counts)):
            if rows.shape[0]:
                hidden = F.silu(rows @ gate[expert].T) * (rows @ up[expert].T)
                outputs.append(hidden @ down[expert].T)
        return torch.cat(outputs) if outputs else x.new_zeros((0, x.shape[1]))


class MoE(nn.Module):
    tokens_per_expert: Tensor

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.gate = Router(config)
        self.experts = RoutedExperts(config)
        self.shared_experts = DenseMLP(
            config.hidden_size, config.moe_intermediate_size * config.n_shared_experts
        )
        # Tokens routed to each expert since the last bias update (aux-loss-free balancing).
        self.register_buffer(
            "tokens_per_expert", torch.zeros(config.n_routed_experts), persistent=False
        )
        # Set by parallelize.apply_expert_parallel; None keeps every expert local.
        self.expert_parallel: ExpertParallel | None = None

    def forward(self, x: Tensor) -> Tensor:
        shape = x.shape
        flat = x.reshape(-1, shape[-1])
        weights, indices = self.gate(flat)
        k = indices.shape[1]
        experts_flat = indices.flatten()
        with torch.no_grad():
            self.tokens_per_expert += torch.bincount(
                experts_flat, minlength=self.config.n_routed_experts
            ).to(self.tokens_per_expert.dtype)
        order = torch.argsort(experts_flat, stable=True)
        token_of = order // k
        routed = flat[token_of]
        counts = torch.bincount(experts_flat, minlength=self.config.n_routed_experts)
        if self.expert_parallel is None:
            out = self.experts(routed, counts.tolist())
        else:
            out = self.expert_parallel.run(routed, counts, self.experts)
        out = out * weights.flatten()[order].unsqueeze(1).to(out.dtype)
        combined = torch.zeros_like(flat).index_add(0, token_of, out.to(flat.dtype))
        return combined.view(shape) + self.shared_experts(x)


@torch.no_grad()
def update_routing_bias(model: nn.Module, speed: float, group: dist.ProcessGroup | None) -> None:
    """Aux-loss-free balancing: raise the bias of under-loaded experts, lower over-loaded.

    Loads are summed over ``group`` (every rank that saw different tokens) so that every
    rank applies the same update and the bias stays identical everywhere.
    """
    for module in model.modules():
        if isinstance(module, MoE):
            load = module.tokens_per_expert
            if group is not None:
                dist.all_reduce(load, group=group)
            bias = module.gate.e_score_correction_bias
            bias += speed * torch.sign(load.mean() - load).to(bias.dtype)
            load.zero_()
