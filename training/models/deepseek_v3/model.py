"""The DeepSeek-V3 causal LM the trainer optimises (the Kimi K2.5 text backbone's design).

Module names follow HF's checkpoint (``model.layers.N.self_attn.q_b_proj`` ...) so that
loading and saving is a rename of the expert tensors only (``hf_io``). Parallelism is not
built in: functions in ``parallelize`` wrap the finished model (FSDP2 meshes, context
parallel, expert parallel), torchtitan style.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor, nn

from training.models.deepseek_v3.attention import MLAttention, RMSNorm
from training.models.deepseek_v3.config import ModelConfig
from training.models.deepseek_v3.moe import DenseMLP, MoE


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, layer: int) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = MLAttention(config)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp: nn.Module = (
            MoE(config)
            if config.is_moe_layer(layer)
            else DenseMLP(config.hidden_size, config.intermediate_size)
        )

    def forward(self, x: Tensor, positions: Tensor) -> Tensor:
        x = x + self.self_attn(self.input_layernorm(x), positions)
        return x + self.mlp(self.post_attention_layernorm(x))  # type: ignore[no-any-return]


class DecoderStack(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(
            DecoderLayer(config, i) for i in range(config.num_hidden_layers)
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class DeepseekV3Model(nn.Module):
    """``forward(input_ids, positions) -> logits`` [batch, seq, vocab]."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.model = DecoderStack(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)

    def forward(self, input_ids: Tensor, positions: Tensor | None = None) -> Tensor:
        if positions is None:
            positions = torch.arange(input_ids.shape[1], device=input_ids.device).expand_as(
                input_ids
            )
        x = self.model.embed_tokens(input_ids)
        for layer in self.model.layers:
            x = layer(x, positions)
        return self.lm_head(self.model.norm(x))  # type: ignore[no-any-return]

    @torch.no_grad()
    def init_weights(self, seed: int) -> None:
        """Normal(0, initializer_range) matrices, unit norms, zero routing bias."""
        generator = torch.Generator().manual_seed(seed)
        std = self.config.initializer_range
        for name, param in self.named_parameters():
            if name.endswith("layernorm.weight") or name.endswith("norm.weight"):
                param.fill_(1.0)
            elif name.endswith(".bias"):
                param.zero_()
            else:
                param.copy_(torch.randn(param.shape, generator=generator) * std)
        for name, buf in self.named_buffers():
            if name.endswith("e_score_correction_bias") or name.endswith("tokens_per_expert"):
                buf.zero_()

    @classmethod
    def from_pretrained(cls, path: Path, device: str | torch.device = "cpu") -> DeepseekV3Model:
        """Build the model from an HF checkpoint directory (config.json + safetensors)."""
        from training.models.deepseek_v3.hf_io import load_hf_state_dict

        config = ModelConfig.from_pretrained(path)
        with torch.device(device):
            model = cls(config)
        model.load_state_dict(load_hf_state_dict(Path(path), config), strict=True)
        return model

    def save_pretrained(self, path: Path) -> None:
        """Write config.json and per-expert safetensors that transformers and vLLM load."""
        from training.models.deepseek_v3.hf_io import save_hf_checkpoint

        save_hf_checkpoint(self.state_dict(), self.config, Path(path))
