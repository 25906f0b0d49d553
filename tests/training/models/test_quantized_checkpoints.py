"""The base checkpoints' quantized formats load dequantized and export back unchanged.

Checkpoints are built here from the tiny checkpoint's weights with code of this file only:
DeepSeek-V3 FP8 (128 x 128 blocks, scale = amax / 448, every projection; the tiny shapes
have partial edge blocks: kv_a_proj_with_mqa is 576 rows, q_a_proj 96) and Kimi INT4
(compressed-tensors pack-quantized, group 32, routed experts only), also in Kimi K2.5's
multimodal layout (the language model under ``language_model.``, a vision tower beside
it, the config under ``text_config``). References decode the bytes with plain
Python/numpy loops, not the loader's code.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from training.models.deepseek_v3.config import ModelConfig
from training.models.deepseek_v3.hf_io import load_hf_state_dict
from training.models.deepseek_v3.model import DeepseekV3Model
from training.models.deepseek_v3.quant import (
    is_quantized,
    pack_int4,
    quantize_fp8,
    quantize_int4,
    scheme_from_config,
    unpack_int4,
)

FP8_CONFIG = {
    "quant_method": "fp8",
    "fmt": "e4m3",
    "weight_block_size": [128, 128],
    "activation_scheme": "dynamic",
}
INT4_CONFIG = {
    "quant_method": "compressed-tensors",
    "format": "pack-quantized",
    "quantization_status": "compressed",
    "config_groups": {
        "group_0": {
            "targets": ["Linear"],
            "input_activations": None,
            "weights": {"num_bits": 4, "type": "int", "symmetric": True,
                        "strategy": "group", "group_size": 32, "dynamic": False},
        }
    },
    "ignore": ["lm_head", "re:.*self_attn.*", "re:.*shared_experts.*",
               "re:.*mlp\\.(gate|up|gate_up|down)_proj.*"],
}  # fmt: skip


def _is_projection(key: str) -> bool:
    # DeepSeek-V3's FP8 checkpoint keeps the MTP layer's eh_proj in bf16 (vLLM loads it
    # into an unquantized Linear).
    return (
        key.startswith("model.layers.")
        and key.endswith(("_proj.weight", "_mqa.weight"))
        and not key.endswith("eh_proj.weight")
    )


def _fp8_value(byte: int) -> float:
    """float8_e4m3fn from its bits: 1 sign, 4 exponent (bias 7), 3 mantissa; no inf."""
    sign = -1.0 if byte & 0x80 else 1.0
    exponent, mantissa = (byte >> 3) & 0xF, byte & 0x7
    if exponent == 0xF and mantissa == 0x7:
        return math.nan
    if exponent == 0:
        return sign * mantissa / 8 * 2.0**-6
    return sign * (1 + mantissa / 8) * 2.0 ** (exponent - 7)


FP8_TABLE = np.array([_fp8_value(b) for b in range(256)])


def _reference_fp8(weight: torch.Tensor, scale_inv: torch.Tensor) -> np.ndarray:
    codes = FP8_TABLE[weight.view(torch.uint8).numpy()]
    scales = scale_inv.numpy().astype(np.float64)
    out = np.empty(codes.shape)
    for bi in range(scales.shape[0]):
        for bj in range(scales.shape[1]):
            rows, cols = slice(bi * 128, (bi + 1) * 128), slice(bj * 128, (bj + 1) * 128)
            out[rows, cols] = codes[rows, cols] * scales[bi, bj]
    return out


def _reference_int4(packed: torch.Tensor, scale: torch.Tensor, shape: list[int]) -> np.ndarray:
    rows, cols = shape
    words = packed.numpy().astype(np.int64) & 0xFFFFFFFF
    scales = scale.float().numpy().astype(np.float64)
    out = np.empty((rows, cols))
    for r in range(rows):
        for c in range(cols):
            nibble = (int(words[r, c // 8]) >> (4 * (c % 8))) & 0xF
            out[r, c] = (nibble - 8) * scales[r, c // 32]
    return out


def _write(path: Path, tensors: dict[str, torch.Tensor], source: Path, quant: dict) -> Path:
    path.mkdir(parents=True)
    config = json.loads((source / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "quantization_config": quant}))
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    return path


def _fp8_checkpoint(source: Path, out: Path) -> Path:
    """DeepSeek's recipe, written out block by block: scale_inv = amax / 448."""
    tensors: dict[str, torch.Tensor] = {}
    for key, weight in load_file(str(source / "model.safetensors")).items():
        if not _is_projection(key):
            tensors[key] = weight.to(torch.bfloat16)
            continue
        w = weight.float()
        scales = torch.empty(-(-w.shape[0] // 128), -(-w.shape[1] // 128))
        codes = torch.empty_like(w)
        for bi in range(scales.shape[0]):
            for bj in range(scales.shape[1]):
                block = w[bi * 128 : (bi + 1) * 128, bj * 128 : (bj + 1) * 128]
                scales[bi, bj] = block.abs().max() / 448
                codes[bi * 128 : (bi + 1) * 128, bj * 128 : (bj + 1) * 128] = block / scales[bi, bj]
        tensors[key] = codes.clamp(-448, 448).to(torch.float8_e4m3fn)
        tensors[f"{key}_scale_inv"] = scales
    return _write(out, tensors, source, FP8_CONFIG)


def _pack_reference(codes: torch.Tensor) -> torch.Tensor:
    rows, cols = codes.shape
    words = np.zeros((rows, cols // 8), dtype=np.uint32)
    for c in range(cols):
        words[:, c // 8] |= (codes[:, c].numpy().astype(np.int64) + 8).astype(np.uint32) << (
            4 * (c % 8)
        )
    return torch.from_numpy(words.view(np.int32))


def _int4_checkpoint(source: Path, out: Path, seed: int = 0) -> Path:
    """Kimi-like experts: random codes in [-8, 7] reaching 7 or -8 in every group (as any
    tight quantizer's do), bf16 scales near the weights' own."""
    generator = torch.Generator().manual_seed(seed)
    tensors: dict[str, torch.Tensor] = {}
    for key, weight in load_file(str(source / "model.safetensors")).items():
        if ".mlp.experts." not in key:
            tensors[key] = weight.to(torch.bfloat16)
            continue
        rows, cols = weight.shape
        codes = torch.randint(-8, 8, (rows, cols), generator=generator, dtype=torch.int8)
        codes[:, ::32] = torch.where(torch.rand(rows, cols // 32, generator=generator) < 0.5, 7, -8)
        scale = (weight.float().view(rows, -1, 32).abs().amax(dim=2) / 7.5).to(torch.bfloat16)
        module = key.removesuffix(".weight")
        tensors[f"{module}.weight_packed"] = _pack_reference(codes)
        tensors[f"{module}.weight_scale"] = scale
        tensors[f"{module}.weight_shape"] = torch.tensor([rows, cols])
    return _write(out, tensors, source, INT4_CONFIG)


@pytest.fixture(scope="module")
def fp8_model(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _fp8_checkpoint(tiny_model, tmp_path_factory.mktemp("fp8") / "model")


@pytest.fixture(scope="module")
def int4_model(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _int4_checkpoint(tiny_model, tmp_path_factory.mktemp("int4") / "model")


def _hf_weights(model: DeepseekV3Model) -> dict[str, torch.Tensor]:
    """The trainer's weights under HF's per-expert names."""
    out = {}
    for name, tensor in model.state_dict().items():
        if name.endswith("_proj") and ".experts." in name:
            for index, expert in enumerate(tensor):
                out[f"{name.replace('.experts.', f'.experts.{index}.')}.weight"] = expert
        else:
            out[name] = tensor
    return out


def test_fp8_blocks_load_as_the_reference_dequantization(fp8_model: Path) -> None:
    source = load_file(str(fp8_model / "model.safetensors"))
    weights = _hf_weights(DeepseekV3Model.from_pretrained(fp8_model))
    quantized = [k for k in source if source[k].dtype == torch.float8_e4m3fn]
    assert "model.layers.0.self_attn.kv_a_proj_with_mqa.weight" in quantized  # 576 rows
    assert len(quantized) == sum(_is_projection(k) for k in weights)
    for key in quantized:
        expected = _reference_fp8(source[key], source[f"{key}_scale_inv"])
        assert weights[key].dtype == torch.float32
        # float32 rounding of a product of the 4-bit code and the scale: within half an ulp.
        np.testing.assert_allclose(weights[key].numpy(), expected, rtol=2**-24, atol=0)
    for key, tensor in weights.items():
        if key not in quantized:
            assert torch.equal(tensor, source[key].float()), key


def test_int4_groups_load_as_the_reference_dequantization(int4_model: Path) -> None:
    source = load_file(str(int4_model / "model.safetensors"))
    weights = _hf_weights(DeepseekV3Model.from_pretrained(int4_model))
    modules = [k.removesuffix(".weight_packed") for k in source if k.endswith("weight_packed")]
    # Two MoE layers (the decoder's and the MTP layer's) of 8 experts: only those are INT4.
    assert len(modules) == 2 * 8 * 3
    for module in modules:
        shape = source[f"{module}.weight_shape"].tolist()
        expected = _reference_int4(
            source[f"{module}.weight_packed"], source[f"{module}.weight_scale"], shape
        )
        # Codes times bf16 scales are exact in float32.
        np.testing.assert_array_equal(weights[f"{module}.weight"].numpy(), expected)


def test_pack_convention_matches_compressed_tensors() -> None:
    helpers = pytest.importorskip("compressed_tensors.compressors.pack_quantized.helpers")
    codes = torch.randint(-8, 8, (5, 40), generator=torch.Generator().manual_seed(1)).to(torch.int8)
    theirs = helpers.pack_to_int32(codes, 4)
    assert torch.equal(pack_int4(codes), theirs)
    assert torch.equal(pack_int4(codes), _pack_reference(codes))
    assert torch.equal(unpack_int4(theirs, 40), codes)
    assert torch.equal(helpers.unpack_from_int32(pack_int4(codes), 4, torch.Size([5, 40])), codes)


def test_int4_export_writes_the_source_checkpoint_back(int4_model: Path, tmp_path: Path) -> None:
    DeepseekV3Model.from_pretrained(int4_model).save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["quantization_config"] == INT4_CONFIG
    source = load_file(str(int4_model / "model.safetensors"))
    exported = load_file(str(tmp_path / "model.safetensors"))
    assert exported.keys() == source.keys()
    for key, tensor in source.items():
        if key.endswith(("weight_packed", "weight_scale", "weight_shape")):
            assert exported[key].dtype == tensor.dtype, key
            assert torch.equal(exported[key], tensor), key


def test_fp8_export_round_trips(fp8_model: Path, tmp_path: Path) -> None:
    loaded = DeepseekV3Model.from_pretrained(fp8_model)
    loaded.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["quantization_config"] == FP8_CONFIG
    source = load_file(str(fp8_model / "model.safetensors"))
    exported = load_file(str(tmp_path / "model.safetensors"))
    assert exported.keys() == source.keys()
    for key, tensor in source.items():
        if tensor.dtype == torch.float8_e4m3fn:
            # The same codes; the scale is recomputed as amax / 448 from a float32 product,
            # so it may move by one float32 ulp.
            assert exported[key].dtype == torch.float8_e4m3fn
            assert torch.equal(exported[key].view(torch.uint8), tensor.view(torch.uint8)), key
            scale = f"{key}_scale_inv"
            torch.testing.assert_close(exported[scale], source[scale], rtol=2**-23, atol=0)
    again = _hf_weights(DeepseekV3Model.from_pretrained(tmp_path))
    for key, tensor in _hf_weights(loaded).items():
        torch.testing.assert_close(again[key], tensor, rtol=2**-22, atol=0)


def test_quantizing_is_within_the_format_rounding_and_idempotent() -> None:
    weight = torch.randn(200, 160, generator=torch.Generator().manual_seed(2))
    weight[:, 40:80] *= 30  # blocks and groups of very different ranges
    codes, scale_inv = quantize_fp8(weight, (128, 128))
    blocks = scale_inv.repeat_interleave(128, 0).repeat_interleave(128, 1)[:200, :160]
    dequantized = codes.float() * blocks
    # e4m3 keeps 3 mantissa bits: relative error <= 2^-4 above the subnormal range.
    assert ((dequantized - weight).abs() <= weight.abs() * 2**-4 + blocks * 2**-9).all()
    again, scale_again = quantize_fp8(dequantized, (128, 128))
    assert torch.equal(again.view(torch.uint8), codes.view(torch.uint8))
    torch.testing.assert_close(scale_again, scale_inv, rtol=2**-23, atol=0)

    packed, scale, shape = quantize_int4(weight, 32)
    steps = scale.float().repeat_interleave(32, dim=1)
    dequantized = unpack_int4(packed, 160).float() * steps
    assert ((dequantized - weight).abs() <= steps * 0.5 * (1 + 2**-7)).all()
    requantized = quantize_int4(dequantized, 32)
    assert all(torch.equal(a, b) for a, b in zip(requantized, (packed, scale, shape), strict=True))


def test_which_modules_are_quantized() -> None:
    kimi, deepseek = scheme_from_config(INT4_CONFIG), scheme_from_config(FP8_CONFIG)
    assert kimi is not None and deepseek is not None
    layer = "model.layers.3"
    assert is_quantized(f"{layer}.mlp.experts.7.down_proj", kimi)
    for module in (
        "self_attn.q_b_proj",
        "self_attn.kv_a_proj_with_mqa",
        "mlp.shared_experts.up_proj",
        "mlp.gate_proj",
    ):
        assert not is_quantized(f"{layer}.{module}", kimi), module
        assert is_quantized(f"{layer}.{module}", deepseek), module
    never = ("lm_head", "model.embed_tokens", f"{layer}.mlp.gate", f"{layer}.input_layernorm")
    for module in never:
        assert not is_quantized(module, kimi) and not is_quantized(module, deepseek), module


def test_unsupported_quantization_is_refused(tiny_model: Path, tmp_path: Path) -> None:
    config = json.loads((tiny_model / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "awq", "bits": 4}
    (tmp_path / "config.json").write_text(json.dumps(config))
    (tmp_path / "model.safetensors").symlink_to(tiny_model / "model.safetensors")
    with pytest.raises(ValueError, match="quantization method 'awq' is not supported"):
        load_hf_state_dict(tmp_path, ModelConfig.from_pretrained(tmp_path))


def test_int4_export_loads_in_transformers(int4_model: Path, tmp_path: Path) -> None:
    """compressed-tensors, through transformers, reads the export as the trainer does."""
    pytest.importorskip("compressed_tensors")
    from transformers import AutoModelForCausalLM, CompressedTensorsConfig

    ours = DeepseekV3Model.from_pretrained(int4_model)
    ours.save_pretrained(tmp_path)
    theirs = AutoModelForCausalLM.from_pretrained(
        tmp_path, dtype=torch.float32, quantization_config=CompressedTensorsConfig(dequantize=True)
    )
    loaded = dict(theirs.named_parameters())
    state = ours.state_dict()
    prefix = "model.layers.1.mlp.experts"
    fused = torch.cat([state[f"{prefix}.gate_proj"], state[f"{prefix}.up_proj"]], dim=1)
    # transformers stacks gate and up; compressed-tensors decompresses to bf16.
    for mine, name in ((fused, "gate_up_proj"), (state[f"{prefix}.down_proj"], "down_proj")):
        torch.testing.assert_close(
            loaded[f"{prefix}.{name}"].float(), mine, rtol=2**-8, atol=0, check_dtype=False
        )


# --- Kimi K2.5's multimodal layout around the INT4 language model -------------------------


def _kimi_k25_checkpoint(source: Path, out: Path) -> Path:
    """K2.5's layout around a language-only checkpoint: its tensors under
    ``language_model.``, a vision tower and projector beside them, and config.json's
    fields under ``text_config`` with the quantization config at the top."""
    generator = torch.Generator().manual_seed(1)
    tensors = {
        f"language_model.{k}": v for k, v in load_file(str(source / "model.safetensors")).items()
    }
    tensors["vision_tower.patch_embed.proj.weight"] = torch.randn(
        32, 3, 14, 14, generator=generator
    ).bfloat16()
    tensors["mm_projector.proj.0.weight"] = torch.randn(128, 32, generator=generator).bfloat16()
    text = json.loads((source / "config.json").read_text())
    config = {
        "architectures": ["KimiK25ForConditionalGeneration"],
        "model_type": "kimi_k25",
        "quantization_config": text.pop("quantization_config"),
        "vision_config": {"hidden_size": 32, "patch_size": 14},
        "text_config": text,
    }
    out.mkdir(parents=True)
    (out / "config.json").write_text(json.dumps(config))
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out  # fmt: skip


def test_kimi_k25_loads_as_its_language_model_and_exports_its_own_layout(
    int4_model: Path, tmp_path: Path
) -> None:
    from training.components.checkpoint import export_hf

    wrapped = _kimi_k25_checkpoint(int4_model, tmp_path / "k25")
    config = ModelConfig.from_pretrained(wrapped)
    language_only = ModelConfig.from_pretrained(int4_model)
    assert config == dataclasses.replace(language_only, extra=config.extra, wrapper=config.wrapper)
    assert config.quantization_config == INT4_CONFIG
    plain = load_hf_state_dict(int4_model, language_only)
    state = load_hf_state_dict(wrapped, config)
    assert state.keys() == plain.keys()
    assert all(torch.equal(state[key], plain[key]) for key in plain)

    model = DeepseekV3Model.from_pretrained(wrapped)
    export_hf(model, model.config, tmp_path / "export", source=wrapped)
    written = json.loads((tmp_path / "export" / "config.json").read_text())
    source_config = json.loads((wrapped / "config.json").read_text())
    assert {k: v for k, v in written.items() if k != "text_config"} == {
        k: v for k, v in source_config.items() if k != "text_config"
    }
    assert written["text_config"]["model_type"] == source_config["text_config"]["model_type"]
    assert "quantization_config" not in written["text_config"]
    source = load_file(str(wrapped / "model.safetensors"))
    exported = load_file(str(tmp_path / "export" / "model.safetensors"))
    assert exported.keys() == source.keys()
    for key, tensor in source.items():
        # The packed experts and the vision tower bit for bit; the rest bf16 -> fp32.
        assert torch.equal(exported[key].to(tensor.dtype), tensor), key
        if not key.startswith("language_model.") or key.endswith("_packed"):
            assert exported[key].dtype == tensor.dtype, key
    # What a streamed weight push sends is what the export wrote.
    assert ModelConfig.from_pretrained(tmp_path / "export") == model.config
