"""The base checkpoints' weight formats: DeepSeek-V3 FP8 blocks and Kimi INT4 groups.

The trainer keeps full-precision weights, so quantized tensors are dequantized on load
and quantized again on export, in the format the checkpoint came in (its
``quantization_config`` stays in ``ModelConfig.extra``), so the serving engines load the
export exactly as they loaded the base model.

- FP8 (DeepSeek-V3, ``quant_method: fp8``): ``weight`` is ``float8_e4m3fn``;
  ``weight_scale_inv`` holds one float32 per block of ``weight_block_size`` (128 x 128),
  partial at the edges; W = fp8 * scale_inv. Quantizing uses DeepSeek's scale, block
  amax / 448 (e4m3's largest finite value).
- INT4 (Kimi K2 Thinking's and K2.5's experts, compressed-tensors ``pack-quantized``): symmetric
  integers in [-8, 7] with one bf16 ``weight_scale`` per ``group_size`` inputs of each
  output row; ``weight_packed`` int32 holds 8 of them along the input dimension, the
  value at input ``8j + i`` in bits ``4i..4i+3`` of column ``j`` stored as ``q + 8``;
  ``weight_shape`` is [out, in]. Quantizing picks the smallest scale that fits the group
  in [-8, 7] without clipping (max / 7 or -min / 8), so a group whose codes reach 7 or -8
  (all this rule writes, and nearly all compressed-tensors' amax / 7.5 writes) quantizes
  back to the same codes and scale.

Which modules are quantized on export: the linear projections of attention and MLPs
(never embeddings, norms, the router, ``lm_head`` or an MTP layer's ``eh_proj``, which
DeepSeek-V3's FP8 checkpoint keeps in bf16) minus the config's ``ignore``
(compressed-tensors; ``re:`` entries are regular expressions) or
``modules_to_not_convert`` / ``ignored_layers`` (FP8). Kimi's list leaves only the routed
experts; DeepSeek-V3's is empty, so every projection is FP8.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

FP8_MAX = 448.0  # largest finite float8_e4m3fn
INT4_MIN, INT4_MAX = -8, 7
_PROJECTION = re.compile(r"^model\.layers\.\d+\.(self_attn|mlp)\.(.+\.)?\w+_proj(_with_mqa)?$")


@dataclass(frozen=True)
class Fp8Blocks:
    """DeepSeek-V3's block-scaled FP8 (``quantization_config.quant_method == "fp8"``)."""

    block: tuple[int, int] = (128, 128)
    ignore: tuple[str, ...] = ()


@dataclass(frozen=True)
class Int4Groups:
    """compressed-tensors ``pack-quantized`` symmetric INT4 with per-group scales."""

    group_size: int = 32
    ignore: tuple[str, ...] = ()


QuantScheme = Fp8Blocks | Int4Groups


def scheme_from_config(config: dict[str, Any] | None) -> QuantScheme | None:
    """The scheme a ``quantization_config`` describes; None for unquantized checkpoints."""
    if not config:
        return None
    method = config.get("quant_method")
    if method == "fp8":
        if config.get("fmt", "e4m3") != "e4m3" or not config.get("weight_block_size"):
            raise ValueError("fp8 checkpoints must be e4m3 with a weight_block_size")
        rows, cols = config["weight_block_size"]
        ignore = config.get("ignored_layers") or config.get("modules_to_not_convert") or []
        return Fp8Blocks((int(rows), int(cols)), tuple(ignore))
    if method == "compressed-tensors":
        if config.get("format") != "pack-quantized":
            raise ValueError(f"compressed-tensors format {config.get('format')!r} is not supported")
        weights = [g.get("weights") or {} for g in config.get("config_groups", {}).values()]
        if len(weights) != 1:
            raise ValueError("compressed-tensors checkpoints must have one config group")
        args = weights[0]
        supported = (
            args.get("num_bits") == 4
            and args.get("type", "int") == "int"
            and args.get("symmetric") is True
            and args.get("strategy") == "group"
            and not args.get("actorder")
        )
        if not supported:
            raise ValueError(f"only symmetric int4 group quantization is supported, got {args}")
        return Int4Groups(int(args["group_size"]), tuple(config.get("ignore", [])))
    raise ValueError(f"quantization method {method!r} is not supported (fp8, compressed-tensors)")


def is_quantized(module: str, scheme: QuantScheme) -> bool:
    """Whether export writes ``module`` (``model.layers.3.mlp.experts.7.up_proj``) quantized."""
    if not _PROJECTION.match(module):
        return False
    for pattern in scheme.ignore:
        if pattern.startswith("re:"):
            if re.match(pattern[3:], module):
                return False
        elif module == pattern or module.endswith("." + pattern):
            return False
    return True


# -- FP8 blocks ----------------------------------------------------------------------------


def _expand_blocks(scales: Tensor, block: tuple[int, int], shape: tuple[int, int]) -> Tensor:
    """One scale per element: each block's scale repeated, cut to ``shape`` at the edges."""
    full = scales.repeat_interleave(block[0], dim=0).repeat_interleave(block[1], dim=1)
    return full[: shape[0], : shape[1]]


def dequantize_fp8(
    weight: Tensor, scale_inv: Tensor, block: tuple[int, int], dtype: torch.dtype
) -> Tensor:
    shape = (weight.shape[0], weight.shape[1])
    expected = (-(-shape[0] // block[0]), -(-shape[1] // block[1]))
    if tuple(scale_inv.shape) != expected:
        raise ValueError(f"weight_scale_inv {tuple(scale_inv.shape)} for {shape}: want {expected}")
    scales = _expand_blocks(scale_inv.float(), block, shape)
    return (weight.float() * scales).to(dtype)


def quantize_fp8(weight: Tensor, block: tuple[int, int]) -> tuple[Tensor, Tensor]:
    """(float8_e4m3fn weight, float32 scale_inv per block), scale_inv = block amax / 448."""
    rows, cols = weight.shape
    w = weight.float()
    padded = w.new_zeros(-(-rows // block[0]) * block[0], -(-cols // block[1]) * block[1])
    padded[:rows, :cols] = w
    blocks = padded.view(padded.shape[0] // block[0], block[0], -1, block[1])
    amax = blocks.abs().amax(dim=(1, 3))
    # An all-zero block gets scale 1 (codes 0): any scale would do, 1 keeps it a fixed point.
    scale_inv = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
    codes = (w / _expand_blocks(scale_inv, block, (rows, cols))).clamp(-FP8_MAX, FP8_MAX)
    return codes.to(torch.float8_e4m3fn), scale_inv


# -- INT4 groups (compressed-tensors pack-quantized) ----------------------------------------


def pack_int4(codes: Tensor) -> Tensor:
    """[rows, cols] int8 in [-8, 7] -> [rows, ceil(cols / 8)] int32, low nibble first."""
    rows, cols = codes.shape
    unsigned = torch.zeros(rows, -(-cols // 8) * 8, dtype=torch.int64, device=codes.device)
    unsigned[:, :cols] = codes.to(torch.int64) - INT4_MIN
    shifts = torch.arange(8, dtype=torch.int64, device=codes.device) * 4
    words = (unsigned.view(rows, -1, 8) << shifts).sum(dim=2)
    # The top nibble reaches bit 31: wrap to int32's two's complement as the format does.
    return torch.where(words >= 1 << 31, words - (1 << 32), words).to(torch.int32)


def unpack_int4(packed: Tensor, cols: int) -> Tensor:
    """Inverse of :func:`pack_int4`: [rows, cols] int8 in [-8, 7]."""
    words = packed.to(torch.int64) & 0xFFFFFFFF
    shifts = torch.arange(8, dtype=torch.int64, device=packed.device) * 4
    nibbles = (words.unsqueeze(-1) >> shifts) & 0xF
    return (nibbles.reshape(packed.shape[0], -1)[:, :cols] + INT4_MIN).to(torch.int8)


def dequantize_int4(
    packed: Tensor, scale: Tensor, shape: Tensor, group: int, dtype: torch.dtype
) -> Tensor:
    rows, cols = (int(v) for v in shape.tolist())
    if tuple(scale.shape) != (rows, -(-cols // group)):
        raise ValueError(f"weight_scale {tuple(scale.shape)} for [{rows}, {cols}], group {group}")
    codes = unpack_int4(packed, cols).float()
    # bf16 scales times 4-bit codes are exact in float32.
    return (codes * scale.float().repeat_interleave(group, dim=1)[:, :cols]).to(dtype)


def quantize_int4(weight: Tensor, group: int) -> tuple[Tensor, Tensor, Tensor]:
    """(weight_packed int32, weight_scale bf16 [rows, groups], weight_shape int64 [2])."""
    rows, cols = weight.shape
    groups = -(-cols // group)
    padded = weight.float().new_zeros(rows, groups * group)
    padded[:, :cols] = weight.float()
    grouped = padded.view(rows, groups, group)
    fit = torch.maximum(grouped.amax(dim=2) / INT4_MAX, grouped.amin(dim=2) / INT4_MIN)
    scale = torch.where(fit > 0, fit, torch.ones_like(fit)).to(torch.bfloat16)
    codes = (grouped / scale.float().unsqueeze(2)).round().clamp(INT4_MIN, INT4_MAX)
    packed = pack_int4(codes.view(rows, -1)[:, :cols].to(torch.int8))
    return packed, scale, torch.tensor([rows, cols], dtype=torch.int64)


# -- whole checkpoints ----------------------------------------------------------------------


def dequantize_checkpoint(
    tensors: dict[str, Tensor], scheme: QuantScheme | None, dtype: torch.dtype = torch.float32
) -> dict[str, Tensor]:
    """HF tensors with every quantized weight replaced by its ``<module>.weight`` in ``dtype``."""
    out: dict[str, Tensor] = {}
    for key, tensor in tensors.items():
        if key.endswith(("_scale_inv", "weight_scale", "weight_shape")):
            continue
        module, _, name = key.rpartition(".")
        if name == "weight_packed":
            if not isinstance(scheme, Int4Groups):
                raise ValueError(f"{key}: packed int4 weights need a compressed-tensors config")
            scale, shape = tensors[f"{module}.weight_scale"], tensors[f"{module}.weight_shape"]
            out[f"{module}.weight"] = dequantize_int4(
                tensor, scale, shape, scheme.group_size, dtype
            )
        elif tensor.dtype == torch.float8_e4m3fn:
            if not isinstance(scheme, Fp8Blocks):
                raise ValueError(f"{key}: float8 weights need an fp8 quantization_config")
            scale_inv = tensors[f"{key}_scale_inv"]
            out[key] = dequantize_fp8(tensor, scale_inv, scheme.block, dtype)
        else:
            out[key] = tensor
    return out


def quantize_checkpoint(tensors: dict[str, Tensor], scheme: QuantScheme) -> dict[str, Tensor]:
    """HF tensors with the scheme's modules quantized under the format's tensor names."""
    out: dict[str, Tensor] = {}
    for key, tensor in tensors.items():
        module, _, name = key.rpartition(".")
        if name != "weight" or not is_quantized(module, scheme):
            out[key] = tensor
        elif isinstance(scheme, Fp8Blocks):
            out[key], out[f"{key}_scale_inv"] = quantize_fp8(tensor, scheme.block)
        else:
            packed, scale, shape = quantize_int4(tensor, scheme.group_size)
            out[f"{module}.weight_packed"] = packed
            out[f"{module}.weight_scale"] = scale
            out[f"{module}.weight_shape"] = shape
    return out
