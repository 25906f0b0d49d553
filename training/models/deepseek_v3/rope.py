"""Rotary position embedding of DeepSeek-V3: default or YaRN-scaled, interleaved or not.

Real DeepSeek-V3 / Kimi checkpoints extend context with YaRN (``rope_scaling`` type
``yarn``: interpolated low frequencies, and a softmax scale multiplied by
``mscale(factor, mscale_all_dim)^2``); the tiny checkpoint uses the default rope. Both are
computed as transformers computes them, so logits agree to float rounding.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from training.models.deepseek_v3.config import ModelConfig, rope_kind


def _mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


@dataclass(frozen=True)
class Rope:
    dim: int
    theta: float
    interleave: bool
    scaling: dict[str, Any] | None = None

    @classmethod
    def from_config(cls, config: ModelConfig) -> Rope:
        return cls(
            config.qk_rope_head_dim, config.rope_theta, config.rope_interleave, config.rope_scaling
        )

    @property
    def kind(self) -> str:
        return rope_kind(self.scaling)

    def inv_freq(self, device: torch.device) -> Tensor:
        exponents = torch.arange(0, self.dim, 2, dtype=torch.float, device=device) / self.dim
        pos_freqs = self.theta**exponents
        if self.kind == "default":
            return 1.0 / pos_freqs
        cfg = self.scaling or {}
        factor = float(cfg["factor"])
        original = float(cfg["original_max_position_embeddings"])
        beta_fast, beta_slow = cfg.get("beta_fast") or 32, cfg.get("beta_slow") or 1

        def correction_dim(rotations: float) -> float:
            return (self.dim * math.log(original / (rotations * 2 * math.pi))) / (
                2 * math.log(self.theta)
            )

        low, high = correction_dim(beta_fast), correction_dim(beta_slow)
        if cfg.get("truncate", True):
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, self.dim - 1)
        if low == high:
            high += 0.001
        ramp = (torch.arange(self.dim // 2, dtype=torch.float, device=device) - low) / (high - low)
        extrapolation = 1 - ramp.clamp(0, 1)
        return (1.0 / (factor * pos_freqs)) * (1 - extrapolation) + (
            1.0 / pos_freqs
        ) * extrapolation

    @property
    def cos_sin_factor(self) -> float:
        if self.kind == "default":
            return 1.0
        cfg = self.scaling or {}
        if cfg.get("attention_factor") is not None:
            return float(cfg["attention_factor"])
        factor, mscale, all_dim = cfg["factor"], cfg.get("mscale"), cfg.get("mscale_all_dim")
        if mscale and all_dim:
            return _mscale(factor, mscale) / _mscale(factor, all_dim)
        return _mscale(factor)

    @property
    def softmax_factor(self) -> float:
        """Multiplier of 1/sqrt(head_dim) (DeepSeek's YaRN ``mscale_all_dim`` squared)."""
        cfg = self.scaling or {}
        if self.kind == "default" or not cfg.get("mscale_all_dim"):
            return 1.0
        return _mscale(cfg["factor"], cfg["mscale_all_dim"]) ** 2

    def cos_sin(self, positions: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """cos and sin per position ([..., dim / 2])."""
        freqs = positions[..., None].float() * self.inv_freq(positions.device)
        factor = self.cos_sin_factor
        return (freqs.cos() * factor).to(dtype), (freqs.sin() * factor).to(dtype)

    def apply(self, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        """Rotate ``x`` [batch, heads, seq, dim] by angles [batch, seq, dim / 2]."""
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        if self.interleave:
            # Pairs (x0, x1), (x2, x3), ...; output de-interleaved, as transformers does (the
            # same permutation on q and k leaves their dot products unchanged).
            x1, x2 = x[..., 0::2], x[..., 1::2]
        else:
            half = x.shape[-1] // 2
            x1, x2 = x[..., :half], x[..., half:]
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)
