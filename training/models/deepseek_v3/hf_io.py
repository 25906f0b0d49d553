"""HF checkpoint format <-> the trainer's state dict.

Three differences: the routed experts, which HF (and vLLM) store one tensor per expert
(``mlp.experts.E.gate_proj.weight``) and the trainer stacks (``mlp.experts.gate_proj``
[E, ...]) so that optimizer and expert-parallel code address experts by one index;
quantized base checkpoints (DeepSeek-V3 FP8, Kimi INT4), dequantized on load and written
back in their own format on export (training.models.deepseek_v3.quant); and the copies of
the embedding and output head that DeepSeek-V3 stores in each multi-token-prediction
layer (``model.layers.61.embed_tokens`` and ``.shared_head.head``). The MTP layers share
those two with the main model, in DeepSeek-V3's training as in vLLM's drafter (which
replaces them with the target model's), so the trainer has one of each: the copies are
dropped on load and written back from the main weights on export.

A multimodal checkpoint (Kimi K2.5) holds this language model under ``language_model.``
beside its vision tower and projector, with the language model's config under
``text_config`` (``ModelConfig.wrapper`` keeps the rest): the trainer loads the language
model, and an export writes it back under the prefix with the vision tensors of the
source checkpoint unchanged (``wrapper_tensors``), in the layout the engines load.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from torch import Tensor

from training.models.deepseek_v3.config import ModelConfig
from training.models.deepseek_v3.quant import (
    dequantize_checkpoint,
    quantize_checkpoint,
    scheme_from_config,
)

_EXPERT_KEY = re.compile(r"^(model\.layers\.\d+\.mlp\.experts)\.(\d+)\.(\w+_proj)\.weight$")
_LAYER_KEY = re.compile(r"^model\.layers\.(\d+)\.")
_MTP_KEY = re.compile(r"^model\.layers\.(\d+)\.eh_proj\.weight$")
# Each MTP layer's copy of a shared weight, and the main model's weight it copies.
_MTP_COPIES = {
    "embed_tokens.weight": "model.embed_tokens.weight",
    "shared_head.head.weight": "lm_head.weight",
}
_SHARD_BYTES = 4 << 30
#: Where a multimodal checkpoint (Kimi K2.5) keeps its language model's tensors.
LANGUAGE_MODEL = "language_model."


def read_hf_tensors(path: Path) -> dict[str, Tensor]:
    """Every tensor of a checkpoint's safetensors files, as written (what an engine reads)."""
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors files in {path}")
    return {key: tensor for file in files for key, tensor in load_file(str(file)).items()}


def language_model_tensors(tensors: dict[str, Tensor], config: ModelConfig) -> dict[str, Tensor]:
    """A checkpoint's language-model tensors under the names the trainer reads: all of
    them for a language-only checkpoint; in a multimodal one (Kimi K2.5), those under
    ``language_model.``, the prefix dropped (the vision tower and projector are not
    trained here, and ``wrapper_tensors`` carries them into an export)."""
    if config.wrapper is None:
        return tensors
    n = len(LANGUAGE_MODEL)
    return {key[n:]: tensor for key, tensor in tensors.items() if key.startswith(LANGUAGE_MODEL)}


def wrapper_tensors(source: Path, config: ModelConfig) -> dict[str, Tensor]:
    """The tensors of ``source`` outside its language model (a multimodal checkpoint's
    vision tower and projector), read without loading the rest; none for a
    language-only checkpoint. An export writes them back unchanged."""
    if config.wrapper is None:
        return {}
    carried: dict[str, Tensor] = {}
    for file in sorted(Path(source).glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as shard:
            for key in shard.keys():  # noqa: SIM118  (safe_open is not a mapping)
                if not key.startswith(LANGUAGE_MODEL):
                    carried[key] = shard.get_tensor(key)
    return carried


def load_hf_state_dict(
    path: Path, config: ModelConfig, dtype: torch.dtype = torch.float32
) -> dict[str, Tensor]:
    """Read every safetensors file of a checkpoint, dequantize quantized weights to
    ``dtype`` and stack the per-expert tensors (MTP layers included, less their copies of
    the shared weights)."""
    last = config.num_hidden_layers + config.num_nextn_predict_layers
    flat: dict[str, Tensor] = {}
    for key, tensor in language_model_tensors(read_hf_tensors(path), config).items():
        layer = _LAYER_KEY.match(key)
        if layer and int(layer.group(1)) >= last:
            continue  # past the layers the config declares: no module would hold it
        if layer and key[layer.end() :] in _MTP_COPIES:
            continue
        flat[key] = tensor
    scheme = scheme_from_config(config.quantization_config)
    experts: dict[tuple[str, str], dict[int, Tensor]] = {}
    state: dict[str, Tensor] = {}
    for key, tensor in dequantize_checkpoint(flat, scheme, dtype).items():
        match = _EXPERT_KEY.match(key)
        if match:
            prefix, index, proj = match.groups()
            experts.setdefault((prefix, proj), {})[int(index)] = tensor
        else:
            state[key] = tensor
    for (prefix, proj), by_index in experts.items():
        if sorted(by_index) != list(range(config.n_routed_experts)):
            raise ValueError(f"{prefix}.*.{proj}: expected {config.n_routed_experts} experts")
        state[f"{prefix}.{proj}"] = torch.stack([by_index[i] for i in range(len(by_index))])
    if "lm_head.weight" not in state and config.tie_word_embeddings:
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
    return state


def mtp_layers_in(state: dict[str, Tensor], config: ModelConfig) -> int:
    """How many of the MTP layers ``config`` declares ``state`` holds. transformers writes
    ``num_nextn_predict_layers`` (default 1) into every DeepSeek-V3 config it saves, with
    no MTP weights; such a checkpoint is a model without MTP layers."""
    first = config.num_hidden_layers
    present = {int(m.group(1)) - first for key in state if (m := _MTP_KEY.match(key))}
    return sum(1 for k in range(config.num_nextn_predict_layers) if k in present)


def to_hf_state_dict(state: dict[str, Tensor]) -> dict[str, Tensor]:
    """Unstack experts into HF's per-expert keys and give each MTP layer its copies of the
    shared weights (tensors made contiguous, on CPU)."""
    out: dict[str, Tensor] = {}
    for key, tensor in state.items():
        if key.endswith("tokens_per_expert"):
            continue
        match = re.match(r"^(model\.layers\.\d+\.mlp\.experts)\.(\w+_proj)$", key)
        if match:
            prefix, proj = match.groups()
            for index, expert in enumerate(tensor.unbind(0)):
                out[f"{prefix}.{index}.{proj}.weight"] = expert.detach().cpu().contiguous()
        else:
            out[key] = tensor.detach().cpu().contiguous()
    for key in list(out):
        mtp = _MTP_KEY.match(key)
        if mtp:
            for copy, source in _MTP_COPIES.items():
                out[f"model.layers.{mtp.group(1)}.{copy}"] = out[source].clone()
    return out


def hf_tensors(
    state: dict[str, Tensor], config: ModelConfig, carried: dict[str, Tensor] | None = None
) -> dict[str, Tensor]:
    """The tensors an HF export holds, by name: HF's keys, quantized as the base checkpoint
    was when its config carries a ``quantization_config`` (what a streamed weight push
    sends, so that an engine loads the same bytes either way). A multimodal checkpoint's
    language model goes under ``language_model.``, beside ``carried`` (``wrapper_tensors``:
    its vision tower and projector), which it needs."""
    tensors = to_hf_state_dict(state)
    scheme = scheme_from_config(config.quantization_config)
    if scheme is not None:
        tensors = quantize_checkpoint(tensors, scheme)
    if config.wrapper is None:
        return tensors
    if not carried:
        raise ValueError(
            "a multimodal checkpoint's export needs the tensors outside its language model "
            "(wrapper_tensors of the source checkpoint)"
        )
    return {**carried, **{LANGUAGE_MODEL + key: tensor for key, tensor in tensors.items()}}


def save_hf_checkpoint(
    state: dict[str, Tensor],
    config: ModelConfig,
    path: Path,
    carried: dict[str, Tensor] | None = None,
) -> None:
    """Write ``config.json`` and safetensors shards (with an index when there are several),
    quantized as the base checkpoint was when its config carries a ``quantization_config``
    (``carried``: as for ``hf_tensors``)."""
    path.mkdir(parents=True, exist_ok=True)
    tensors = hf_tensors(state, config, carried)
    shards: list[dict[str, Tensor]] = [{}]
    size = 0
    for key in sorted(tensors):
        nbytes = tensors[key].numel() * tensors[key].element_size()
        if size and size + nbytes > _SHARD_BYTES:
            shards.append({})
            size = 0
        shards[-1][key] = tensors[key]
        size += nbytes
    config.save(path)
    if len(shards) == 1:
        save_file(shards[0], str(path / "model.safetensors"), metadata={"format": "pt"})
        return
    weight_map: dict[str, str] = {}
    for number, shard in enumerate(shards, start=1):
        name = f"model-{number:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(path / name), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(shard, name))
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (path / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
