"""The DeepSeek-V3 causal LM the trainer optimises (the Kimi K2.5 text backbone's design).

Module names follow HF's checkpoint (``model.layers.N.self_attn.q_b_proj`` ...) so that
loading and saving is a rename of the expert tensors only (``hf_io``). Parallelism is not
built in: functions in ``parallelize`` wrap the finished model (FSDP2 meshes, context
parallel, expert parallel), torchtitan style.

DeepSeek-V3's multi-token-prediction (MTP) layers follow the decoder layers in
``model.layers`` (``num_nextn_predict_layers`` of them), as in the checkpoint. The causal
LM's logits never depend on them; ``forward`` runs them only when asked for their
predictions (the MTP loss, and what vLLM's fast variant drafts with).
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


class SharedHead(nn.Module):
    """The MTP layer's final norm. Its output head is the model's ``lm_head`` (shared, as
    DeepSeek-V3 trains it and vLLM's drafter runs it); checkpoints keep a copy of it as
    ``shared_head.head``, which ``hf_io`` drops on load and writes back on export."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class MultiTokenPredictionLayer(DecoderLayer):
    """DeepSeek-V3's MTP module k (``model.layers.{num_hidden_layers + k - 1}``).

    At position i it reads the embedding of token i+k and the previous depth's hidden
    state at i (the main model's final-norm output for k = 1), and its output, after
    ``shared_head.norm``, gives the logits of token i+k+1 through ``lm_head`` and is the
    next depth's previous hidden state. ``forward`` takes the two concatenated
    ([embedding | previous hidden]) so that it keeps the decoder layer's signature, and so
    FSDP's hooks, which wrap ``forward``, gather every parameter it uses.
    """

    def __init__(self, config: ModelConfig, layer: int) -> None:
        super().__init__(config, layer)
        self.enorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.hnorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.eh_proj = nn.Linear(2 * config.hidden_size, config.hidden_size, bias=False)
        self.shared_head = SharedHead(config)

    def forward(self, x: Tensor, positions: Tensor) -> Tensor:
        embeds, previous = x.chunk(2, dim=-1)
        x = self.eh_proj(torch.cat([self.enorm(embeds), self.hnorm(previous)], dim=-1))
        return self.shared_head.norm(super().forward(x, positions))  # type: ignore[no-any-return]


class DecoderStack(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        main = config.num_hidden_layers
        self.layers = nn.ModuleList(
            [DecoderLayer(config, i) for i in range(main)]
            + [
                MultiTokenPredictionLayer(config, main + k)
                for k in range(config.num_nextn_predict_layers)
            ]
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class DeepseekV3Model(nn.Module):
    """``forward(input_ids, positions) -> logits`` [batch, seq, vocab]; with
    ``mtp_input_ids`` also the MTP layers' logits (see ``forward``)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.model = DecoderStack(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)

    def forward(
        self,
        input_ids: Tensor,
        positions: Tensor | None = None,
        mtp_input_ids: Tensor | None = None,
    ) -> Tensor | tuple[Tensor, list[Tensor]]:
        """Logits; given ``mtp_input_ids`` [batch, seq, depths] (at position i, depth k:
        token i+k, training.components.losses.mtp_inputs), also one logits tensor per MTP depth."""
        if positions is None:
            positions = torch.arange(input_ids.shape[1], device=input_ids.device).expand_as(
                input_ids
            )
        main = self.config.num_hidden_layers
        x = self.model.embed_tokens(input_ids)
        for layer in self.model.layers[:main]:
            x = layer(x, positions)
        hidden = self.model.norm(x)
        logits: Tensor = self.lm_head(hidden)
        if mtp_input_ids is None:
            return logits
        mtp_logits = []
        for depth, layer in enumerate(self.model.layers[main:]):
            embeds = self.model.embed_tokens(mtp_input_ids[..., depth])
            # vLLM's drafter zeroes the token embedding at position 0 (deepseek_mtp.py);
            # training on the same inputs trains what the engine drafts with.
            embeds = embeds.masked_fill((positions == 0).unsqueeze(-1), 0.0)
            hidden = layer(torch.cat([embeds, hidden], dim=-1), positions)
            mtp_logits.append(self.lm_head(hidden))
        return logits, mtp_logits

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
        from training.models.deepseek_v3.hf_io import load_hf_state_dict, mtp_layers_in

        config = ModelConfig.from_pretrained(path)
        state = load_hf_state_dict(Path(path), config)
        config.num_nextn_predict_layers = mtp_layers_in(state, config)
        with torch.device(device):
            model = cls(config)
        model.load_state_dict(state, strict=True)
        return model

    def save_pretrained(self, path: Path) -> None:
        """Write config.json and per-expert safetensors that transformers and vLLM load."""
        from training.models.deepseek_v3.hf_io import save_hf_checkpoint

        save_hf_checkpoint(self.state_dict(), self.config, Path(path))
