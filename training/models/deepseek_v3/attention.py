"""Multi-head latent attention (MLA) of DeepSeek-V3, laid out as HF's checkpoint.

Queries go through a low-rank ``q_a_proj`` -> RMSNorm -> ``q_b_proj`` (or one ``q_proj``);
keys and values share one compressed latent from ``kv_a_proj_with_mqa`` whose last
``qk_rope_head_dim`` channels carry the single rotary key shared by all heads
(training.models.deepseek_v3.rope).

Each layer keeps the largest pre-softmax logit of every head since the trainer last read
it (``max_logits``), for QK-clip (training.models.deepseek_v3.qk_clip) and the metrics.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from training.distributed.context_parallel import ContextParallel
from training.models.deepseek_v3.config import ModelConfig
from training.models.deepseek_v3.rope import Rope


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        dtype = x.dtype
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(dtype)


class MLAttention(nn.Module):
    max_logits: Tensor

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.num_heads = config.num_attention_heads
        hidden, heads = config.hidden_size, config.num_attention_heads
        bias = config.attention_bias
        if config.q_lora_rank is None:
            self.q_proj = nn.Linear(hidden, heads * config.qk_head_dim, bias=False)
        else:
            self.q_a_proj = nn.Linear(hidden, config.q_lora_rank, bias=bias)
            self.q_a_layernorm = RMSNorm(config.q_lora_rank)
            self.q_b_proj = nn.Linear(config.q_lora_rank, heads * config.qk_head_dim, bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(
            hidden, config.kv_lora_rank + config.qk_rope_head_dim, bias=bias
        )
        self.kv_a_layernorm = RMSNorm(config.kv_lora_rank)
        self.kv_b_proj = nn.Linear(
            config.kv_lora_rank, heads * (config.qk_nope_head_dim + config.v_head_dim), bias=False
        )
        self.o_proj = nn.Linear(heads * config.v_head_dim, hidden, bias=bias)
        self.rope = Rope.from_config(config)
        self.scaling = config.qk_head_dim**-0.5 * self.rope.softmax_factor
        # Set by parallelize.apply_context_parallel; None means the whole sequence.
        self.context_parallel: ContextParallel | None = None
        # Per head, this rank's largest logit since the last read; not saved (a step's
        # statistic, not model state).
        self.register_buffer("max_logits", torch.full((heads,), float("-inf")), persistent=False)

    def _queries(self, x: Tensor) -> Tensor:
        if self.config.q_lora_rank is None:
            return self.q_proj(x)  # type: ignore[no-any-return]
        return self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x)))  # type: ignore[no-any-return]

    def forward(self, x: Tensor, positions: Tensor) -> Tensor:
        """``x`` [batch, seq, hidden]; ``positions`` [batch, seq] global token positions."""
        cfg = self.config
        batch, seq, _ = x.shape
        q = self._queries(x).view(batch, seq, self.num_heads, cfg.qk_head_dim).transpose(1, 2)
        q_nope, q_rot = q.split([cfg.qk_nope_head_dim, cfg.qk_rope_head_dim], dim=-1)

        latent, k_rot = self.kv_a_proj_with_mqa(x).split(
            [cfg.kv_lora_rank, cfg.qk_rope_head_dim], dim=-1
        )
        latent = self.kv_a_layernorm(latent)
        cos, sin = self.rope.cos_sin(positions, x.dtype)
        q_rot = self.rope.apply(q_rot, cos, sin)
        k_rot = self.rope.apply(k_rot.unsqueeze(1), cos, sin).squeeze(1)

        key_positions = positions
        if self.context_parallel is not None:
            cp = self.context_parallel
            latent = cp.gather_sequence(latent)
            k_rot = cp.gather_sequence(k_rot)
            key_positions = cp.gather_sequence(positions)
        kv_seq = latent.shape[1]

        kv = self.kv_b_proj(latent).view(
            batch, kv_seq, self.num_heads, cfg.qk_nope_head_dim + cfg.v_head_dim
        )
        k_nope, v = kv.transpose(1, 2).split([cfg.qk_nope_head_dim, cfg.v_head_dim], dim=-1)
        k = torch.cat([k_nope, k_rot.unsqueeze(1).expand(-1, self.num_heads, -1, -1)], dim=-1)
        qk = torch.cat([q_nope, q_rot], dim=-1)

        causal = key_positions.unsqueeze(1) <= positions.unsqueeze(2)  # [batch, q, k]
        scores = torch.matmul(qk, k.transpose(2, 3)) * self.scaling
        scores = scores.masked_fill(~causal.unsqueeze(1), float("-inf"))
        with torch.no_grad():
            # Masked entries are -inf, so only real query-key pairs count.
            torch.maximum(self.max_logits, scores.amax(dim=(0, 2, 3)).float(), out=self.max_logits)
        probs = F.softmax(scores, dim=-1, dtype=torch.float32).to(qk.dtype)
        out = torch.matmul(probs, v).transpose(1, 2).reshape(batch, seq, -1)
        return self.o_proj(out)  # type: ignore[no-any-return]
