"""DeepSeek-V3 hyper-parameters, read from and written to an HF ``config.json``.

The trainer's model and the serving checkpoint share one ``config.json``; this dataclass
holds the fields the model needs and keeps every other key untouched (``extra``) so that a
checkpoint saved after training still carries what vLLM and the tokenizer read.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


def rope_kind(scaling: dict[str, Any] | None) -> str:
    """``default`` or the scaling's type (``yarn`` for DeepSeek-V3 and Kimi checkpoints)."""
    if not scaling:
        return "default"
    return str(scaling.get("rope_type", scaling.get("type", "default")))


@dataclass
class ModelConfig:
    """The DeepSeek-V3 architecture (names as in HF's ``DeepseekV3Config``)."""

    vocab_size: int = 1024
    hidden_size: int = 128
    intermediate_size: int = 256
    moe_intermediate_size: int = 64
    num_hidden_layers: int = 2
    first_k_dense_replace: int = 1
    num_attention_heads: int = 2
    q_lora_rank: int | None = 96
    kv_lora_rank: int = 512
    qk_nope_head_dim: int = 64
    qk_rope_head_dim: int = 64
    v_head_dim: int = 64
    n_routed_experts: int = 8
    num_experts_per_tok: int = 2
    n_shared_experts: int = 1
    n_group: int = 1
    topk_group: int = 1
    norm_topk_prob: bool = True
    routed_scaling_factor: float = 2.5
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_interleave: bool = True
    max_position_embeddings: int = 4096
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    initializer_range: float = 0.02
    # Multi-token-prediction layers after the decoder layers (DeepSeek-V3: 1), kept for
    # the fast variant's speculative decoding and trained by the MTP loss.
    num_nextn_predict_layers: int = 0
    # Every other config.json key (token ids, rope scaling, dtype, ...), kept for saving.
    extra: dict[str, Any] = field(default_factory=dict)
    # A multimodal checkpoint's config around this language model (Kimi K2.5: its vision
    # config, architectures, quantization...), every key but ``text_config``, which holds
    # the fields above; None for a language-only checkpoint. Kept for saving.
    wrapper: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        self.validate()

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    def is_moe_layer(self, layer: int) -> bool:
        return layer >= self.first_k_dense_replace and self.n_routed_experts > 0

    def validate(self) -> None:
        """Reject shapes the architecture cannot build, naming the constraint."""
        if self.n_routed_experts and self.n_routed_experts % self.n_group:
            raise ValueError(
                f"n_routed_experts ({self.n_routed_experts}) must be divisible by "
                f"n_group ({self.n_group})"
            )
        if self.topk_group > self.n_group:
            raise ValueError(f"topk_group ({self.topk_group}) must be <= n_group ({self.n_group})")
        if self.num_experts_per_tok > self.n_routed_experts and self.n_routed_experts:
            raise ValueError("num_experts_per_tok must be <= n_routed_experts")
        if self.qk_rope_head_dim % 2:
            raise ValueError(f"qk_rope_head_dim ({self.qk_rope_head_dim}) must be even")
        if self.num_nextn_predict_layers < 0:
            raise ValueError("num_nextn_predict_layers must be >= 0")
        if self.rope_kind not in ("default", "yarn"):
            raise ValueError(f"rope scaling {self.rope_kind!r} is not supported (default or yarn)")

    @property
    def rope_kind(self) -> str:
        return rope_kind(self.rope_scaling)

    @property
    def rope_scaling(self) -> dict[str, Any] | None:
        value = self.extra.get("rope_scaling")
        return value if isinstance(value, dict) else None

    @property
    def quantization_config(self) -> dict[str, Any] | None:
        """The checkpoint's ``quantization_config``: the language model's own, else the
        multimodal wrapper's (Kimi K2.5 declares it at the top)."""
        value = self.extra.get("quantization_config")
        if value is None and self.wrapper is not None:
            value = self.wrapper.get("quantization_config")
        return value if isinstance(value, dict) else None

    @classmethod
    def from_hf_dict(cls, data: dict[str, Any]) -> ModelConfig:
        text = data.get("text_config")
        if isinstance(text, dict):
            wrapper = {k: v for k, v in data.items() if k != "text_config"}
            return dataclasses.replace(cls.from_hf_dict(text), wrapper=wrapper)
        names = {f.name for f in dataclasses.fields(cls)} - {"extra", "wrapper"}
        values = {k: v for k, v in data.items() if k in names}
        # transformers 5 nests rope_theta inside rope_parameters.
        rope = data.get("rope_parameters")
        if isinstance(rope, dict) and "rope_theta" in rope and "rope_theta" not in values:
            values["rope_theta"] = rope["rope_theta"]
        extra = {k: v for k, v in data.items() if k not in names}
        if isinstance(rope, dict) and rope.get("rope_type", "default") != "default":
            extra.setdefault("rope_scaling", rope)
        return cls(**values, extra=extra)

    def to_hf_dict(self) -> dict[str, Any]:
        data = dict(self.extra)
        for f in dataclasses.fields(self):
            if f.name not in ("extra", "wrapper"):
                data[f.name] = getattr(self, f.name)
        data.setdefault("architectures", ["DeepseekV3ForCausalLM"])
        # A multimodal wrapper's model class builds its language model by the text config's
        # own type; a language-only checkpoint is served as DeepSeek-V3.
        wrapped = self.wrapper is not None and "model_type" in self.extra
        data["model_type"] = self.extra["model_type"] if wrapped else "deepseek_v3"
        data.setdefault("num_key_value_heads", self.num_attention_heads)
        data.setdefault("topk_method", "noaux_tc")
        data.setdefault("scoring_func", "sigmoid")
        data.setdefault("hidden_act", "silu")
        data["torch_dtype"] = "float32"
        if self.wrapper is not None:
            return {**self.wrapper, "text_config": data}
        return data

    @classmethod
    def from_pretrained(cls, path: Path) -> ModelConfig:
        return cls.from_hf_dict(json.loads((Path(path) / "config.json").read_text()))

    def save(self, path: Path) -> None:
        text = json.dumps(self.to_hf_dict(), indent=2, sort_keys=True) + "\n"
        (Path(path) / "config.json").write_text(text)
