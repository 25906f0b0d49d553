"""Sharded save/resume with torch.distributed.checkpoint, and HF export for serving.

A DCP checkpoint holds the model (incl. the routing biases), the optimizer state and the
step. Data needs no state (training.components.data derives each step's batch from the step), so a
resumed run takes exactly the path an uninterrupted one would.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from training.models.deepseek_v3.config import ModelConfig
from training.models.deepseek_v3.hf_io import save_hf_checkpoint, wrapper_tensors
from training.models.deepseek_v3.model import DeepseekV3Model

_PREFIX = "step-"
_TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "generation_config.json",
)


def checkpoint_path(root: Path, step: int) -> Path:
    return root / f"{_PREFIX}{step:08d}"


def latest_checkpoint(root: Path | None) -> Path | None:
    """The newest complete checkpoint under ``root`` (DCP writes .metadata last)."""
    if root is None or not root.is_dir():
        return None
    done = [p for p in root.glob(f"{_PREFIX}*") if (p / ".metadata").is_file()]
    return max(done, key=lambda p: int(p.name[len(_PREFIX) :]), default=None)


def save_checkpoint(root: Path, step: int, model: nn.Module, optimizer: Any) -> Path:
    model_state, optim_state = get_state_dict(model, optimizer)
    path = checkpoint_path(root, step)
    state = {"model": model_state, "optim": optim_state, "step": torch.tensor(step)}
    dcp.save(state, checkpoint_id=str(path))
    return path


def load_checkpoint(path: Path, model: nn.Module, optimizer: Any) -> int:
    """Restore model and optimizer in place; returns the step the checkpoint was taken at."""
    model_state, optim_state = get_state_dict(model, optimizer)
    state: dict[str, Any] = {"model": model_state, "optim": optim_state, "step": torch.tensor(0)}
    dcp.load(state, checkpoint_id=str(path))
    set_state_dict(
        model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"]
    )
    return int(state["step"])


def full_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every weight gathered whole, in float32 on CPU (all ranks must call)."""
    full = {}
    for name, tensor in model.state_dict().items():
        gather = getattr(tensor, "full_tensor", None)
        full[name] = (gather() if gather is not None else tensor).detach().float().cpu()
    return full


def export_hf(model: nn.Module, config: ModelConfig, out: Path, source: Path | None) -> None:
    """Gather full weights and write an HF checkpoint on rank 0 (all ranks must call)."""
    full = full_state(model)
    if not dist.is_initialized() or dist.get_rank() == 0:
        carried = wrapper_tensors(source, config) if source is not None else None
        save_hf_checkpoint(full, config, out, carried)
        if source is not None:
            for name in _TOKENIZER_FILES:
                if (source / name).is_file():
                    shutil.copy2(source / name, out / name)
    if dist.is_initialized():
        dist.barrier()


def graft_mtp_layers(base: Path, donor: Path, out: Path) -> Path:
    """``base``'s checkpoint with ``donor``'s MTP layers (the layers past the last decoder
    layer), written to ``out`` with ``base``'s tokenizer files: the target model of one
    checkpoint drafting with another's MTP layer."""
    model = DeepseekV3Model.from_pretrained(base)
    first = model.config.num_hidden_layers
    drafter = DeepseekV3Model.from_pretrained(donor).model.layers[first:]
    model.model.layers[first:].load_state_dict(drafter.state_dict())
    model.save_pretrained(out)
    for name in _TOKENIZER_FILES:
        if (base / name).is_file():
            shutil.copy2(base / name, out / name)
    return out
