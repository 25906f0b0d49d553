"""The trainer's DeepSeek-V3 against transformers' on the tiny serving checkpoint."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from training.models.deepseek_v3.config import ModelConfig
from training.models.deepseek_v3.model import DeepseekV3Model


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
    reloaded = DeepseekV3Model.from_pretrained(tmp_path).eval()
    assert not reloaded.config.rope_interleave
    ids = _ids(model.config.vocab_size)
    with torch.no_grad():
        ours = reloaded(ids)
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


def test_yarn_rope_matches_transformers(tmp_path: Path) -> None:
    """DeepSeek-V3's own rope scaling (YaRN, mscale_all_dim), past the original context."""
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    yarn = {
        "rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "mscale": 1.0,
        "mscale_all_dim": 1.0, "beta_fast": 32, "beta_slow": 1,
        "original_max_position_embeddings": 16,
    }  # fmt: skip
    config = DeepseekV3Config(
        vocab_size=64, hidden_size=32, intermediate_size=48, moe_intermediate_size=16,
        num_hidden_layers=2, first_k_dense_replace=1, num_attention_heads=2,
        num_key_value_heads=2, q_lora_rank=16, kv_lora_rank=16, qk_nope_head_dim=8,
        qk_rope_head_dim=8, v_head_dim=8, n_routed_experts=4, num_experts_per_tok=2,
        n_group=1, topk_group=1, max_position_embeddings=64, rope_parameters=yarn,
    )  # fmt: skip
    torch.manual_seed(0)
    DeepseekV3ForCausalLM(config).save_pretrained(tmp_path)
    ours = DeepseekV3Model.from_pretrained(tmp_path).eval()
    assert ours.config.rope_kind == "yarn"
    ids = torch.randint(0, 64, (1, 48), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        assert _relative_error(ours(ids), _hf_logits(tmp_path, ids)) <= 1e-5


def test_unsupported_rope_scaling_is_named() -> None:
    with pytest.raises(ValueError, match="rope scaling 'longrope' is not supported"):
        ModelConfig.from_hf_dict({"rope_scaling": {"rope_type": "longrope", "factor": 40}})


def test_routing_bias_moves_toward_balance() -> None:
    from training.models.deepseek_v3.moe import MoE, update_routing_bias

    small = ModelConfig(
        hidden_size=32, num_attention_heads=2, q_lora_rank=16, kv_lora_rank=16,
        qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=8, vocab_size=64, n_routed_experts=4,
    )  # fmt: skip
    model = DeepseekV3Model(small)
    moe = next(m for m in model.modules() if isinstance(m, MoE))
    moe.tokens_per_expert.copy_(torch.tensor([10.0, 0.0, 5.0, 5.0]))
    update_routing_bias(model, 0.01, None)
    assert moe.gate.e_score_correction_bias.tolist() == pytest.approx([-0.01, 0.01, 0.0, 0.0])
    assert moe.tokens_per_expert.sum() == 0


def test_bf16_autocast_stays_close_to_fp32(tiny_model: Path) -> None:
    model = DeepseekV3Model.from_pretrained(tiny_model).eval()
    ids = _ids(model.config.vocab_size)
    with torch.no_grad():
        full = model(ids)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            half = model(ids)
    assert half.dtype == torch.bfloat16
    assert _relative_error(half.float(), full) < 5e-2


def test_token_logprobs_for_loss_hooks() -> None:
    from training.components.losses import IGNORE_INDEX, cross_entropy_loss, token_logprobs

    logits = torch.randn(2, 5, 11, generator=torch.Generator().manual_seed(0))
    labels = torch.tensor([[1, 2, 3, IGNORE_INDEX, 4], [0, 10, IGNORE_INDEX, 5, 6]])
    logprobs = token_logprobs(logits, labels)
    manual = torch.log_softmax(logits, -1)[0, 1, 2]
    assert logprobs[0, 1] == pytest.approx(float(manual))
    assert logprobs[0, 3] == 0 and logprobs[1, 2] == 0
    terms = cross_entropy_loss(logits, {"labels": labels})
    assert int(terms.tokens) == 8
    assert float(terms.loss_sum) == pytest.approx(float(-logprobs.sum()), rel=1e-6)


def test_mtp_layer_is_kept_and_exported(tiny_model: Path, tmp_path: Path) -> None:
    """The tiny checkpoint's MTP layer (DeepSeek-V3's names) loads into the model and comes
    back out: untouched, tensor for tensor; trained, with its own new values and copies of
    the new shared embedding and head."""
    from safetensors.torch import load_file

    from training.models.deepseek_v3.model import MultiTokenPredictionLayer

    model = DeepseekV3Model.from_pretrained(tiny_model)
    assert model.config.num_nextn_predict_layers == 1
    assert isinstance(model.model.layers[2], MultiTokenPredictionLayer)
    model.save_pretrained(tmp_path / "same")
    served = load_file(str(tiny_model / "model.safetensors"))
    saved = load_file(str(tmp_path / "same" / "model.safetensors"))
    mtp = {key for key in served if key.startswith("model.layers.2.")}
    assert {f"model.layers.2.{name}.weight" for name in (
        "enorm", "hnorm", "eh_proj", "shared_head.norm", "shared_head.head", "embed_tokens",
        "self_attn.kv_b_proj", "mlp.experts.7.down_proj", "mlp.shared_experts.up_proj",
    )} <= mtp  # fmt: skip
    assert saved.keys() == served.keys()
    for key in served:
        assert torch.equal(saved[key], served[key]), key

    with torch.no_grad():
        model.model.layers[2].eh_proj.weight.mul_(2.0)
        model.lm_head.weight.add_(1.0)
    model.save_pretrained(tmp_path / "trained")
    trained = load_file(str(tmp_path / "trained" / "model.safetensors"))
    assert torch.equal(
        trained["model.layers.2.eh_proj.weight"], 2 * served["model.layers.2.eh_proj.weight"]
    )
    assert torch.equal(trained["model.layers.2.shared_head.head.weight"], trained["lm_head.weight"])
    assert torch.equal(
        trained["model.layers.2.embed_tokens.weight"], trained["model.embed_tokens.weight"]
    )
    assert (
        DeepseekV3Model.from_pretrained(tmp_path / "trained").config.num_nextn_predict_layers == 1
    )


def test_mtp_layers_the_checkpoint_lacks_are_not_built(tiny_model: Path, tmp_path: Path) -> None:
    """transformers writes num_nextn_predict_layers 1 into configs whose weights have no
    MTP layer (the yarn test's checkpoint); a config that declares none leaves the
    checkpoint's MTP tensors unread."""
    import json

    from safetensors.torch import load_file, save_file

    tensors = load_file(str(tiny_model / "model.safetensors"))
    config = json.loads((tiny_model / "config.json").read_text())
    without = {k: v for k, v in tensors.items() if not k.startswith("model.layers.2.")}
    (tmp_path / "without").mkdir()
    save_file(without, str(tmp_path / "without" / "model.safetensors"))
    (tmp_path / "without" / "config.json").write_text(json.dumps(config))
    model = DeepseekV3Model.from_pretrained(tmp_path / "without")
    assert model.config.num_nextn_predict_layers == 0 and len(model.model.layers) == 2
    model.save_pretrained(tmp_path / "without-saved")
    assert ModelConfig.from_pretrained(tmp_path / "without-saved").num_nextn_predict_layers == 0

    (tmp_path / "undeclared").mkdir()
    save_file(tensors, str(tmp_path / "undeclared" / "model.safetensors"))
    config["num_nextn_predict_layers"] = 0
    (tmp_path / "undeclared" / "config.json").write_text(json.dumps(config))
    assert len(DeepseekV3Model.from_pretrained(tmp_path / "undeclared").model.layers) == 2
