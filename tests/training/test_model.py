"""The trainer's DeepSeek-V3 against transformers' on the tiny serving checkpoint."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from training.model import DeepseekV3Model
from training.model_config import ModelConfig


def _hf_logits(path: Path, ids: torch.Tensor) -> torch.Tensor:
    from transformers import DeepseekV3ForCausalLM

    model = DeepseekV3ForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    with torch.no_grad():
        return model(ids).logits


def _ids(vocab: int) -> torch.Tensor:
    return torch.randint(0, vocab, (2, 24), generator=torch.Generator().manual_seed(1))


def _relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


def test_logits_match_transformers(tiny_model: Path) -> None:
    model = DeepseekV3Model.from_pretrained(tiny_model).eval()
    ids = _ids(model.config.vocab_size)
    with torch.no_grad():
        ours = model(ids)
    assert _relative_error(ours, _hf_logits(tiny_model, ids)) <= 1e-5


def test_non_interleaved_rope_matches_transformers(tiny_model: Path, tmp_path: Path) -> None:
    model = DeepseekV3Model.from_pretrained(tiny_model).eval()
    model.config.rope_interleave = False
    model.save_pretrained(tmp_path)
    ids = _ids(model.config.vocab_size)
    with torch.no_grad():
        ours = model(ids)
    assert _relative_error(ours, _hf_logits(tmp_path, ids)) <= 1e-5


def test_saved_checkpoint_loads_in_transformers(tiny_model: Path, tmp_path: Path) -> None:
    """A trained-looking model (weights and routing bias moved) round-trips through HF.

    The saved files use the per-expert layout of the tiny checkpoint that the session's
    vLLM serves (same keys, shapes and config fields), so vLLM loads them the same way.
    """
    model = DeepseekV3Model.from_pretrained(tiny_model)
    gen = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn(param.shape, generator=gen) * 0.01)
        for name, buf in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                buf.add_(torch.randn(buf.shape, generator=gen) * 0.05)
    model.save_pretrained(tmp_path)

    with (
        safe_open(str(tiny_model / "model.safetensors"), "pt") as ref,
        safe_open(str(tmp_path / "model.safetensors"), "pt") as out,
    ):
        keys = set(ref.keys())
        assert set(out.keys()) == keys
        assert "model.layers.1.mlp.experts.7.down_proj.weight" in keys
        for key in keys:
            assert out.get_slice(key).get_shape() == ref.get_slice(key).get_shape(), key
    served = ModelConfig.from_pretrained(tiny_model).to_hf_dict()
    saved = ModelConfig.from_pretrained(tmp_path).to_hf_dict()
    for key in (
        "topk_method",
        "scoring_func",
        "n_routed_experts",
        "rope_interleave",
        "eos_token_id",
    ):
        assert saved[key] == served[key], key

    ids = _ids(model.config.vocab_size)
    with torch.no_grad():
        ours = model.eval()(ids)
    hf = _hf_logits(tmp_path, ids)
    assert _relative_error(ours, hf) <= 1e-5
    reloaded = DeepseekV3Model.from_pretrained(tmp_path).eval()
    with torch.no_grad():
        assert torch.equal(reloaded(ids), ours)


def test_unsupported_rope_scaling_is_named() -> None:
    with pytest.raises(ValueError, match="rope scaling 'yarn'"):
        ModelConfig.from_hf_dict({"rope_scaling": {"rope_type": "yarn", "factor": 40}})
