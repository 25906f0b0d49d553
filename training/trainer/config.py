"""The trainer's configuration: one dataclass tree, JSON round-trippable.

`cstack train` validates it in the launching process (so bad configs fail before torchrun
starts any worker) and hands it to every rank as JSON.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from training.distributed.config import ParallelConfig
from training.models.deepseek_v3.config import ModelConfig
from training.optim.config import MuonConfig, NewtonSchulzConfig
from training.trainer.options import option


@dataclass
class TrainerConfig:
    """One training run. Fields declared with ``option`` are ``cstack train``'s flags."""

    model_path: Path | None = option(
        None, "HF checkpoint directory to start from.", flag="model", required=True
    )
    #: Without ``model_path``, a random model of this shape is built (tests, benchmarks).
    model: ModelConfig | None = None
    data_path: Path | None = option(
        None, "JSONL with 'text' or 'input_ids' per line; default: random tokens.", flag="data"
    )
    steps: int = option(10, "Optimizer steps to reach.")
    batch_size: int = option(8, "Samples per step, over all ranks.")
    seq_len: int = option(64, "Tokens per sample.")
    seed: int = option(0, "Seed for data order and initialisation.")
    grad_clip: float = option(1.0, "Global gradient norm limit (0: off).")
    bf16: bool = option(False, "bf16 autocast for forward and backward.")
    #: Aux-loss-free balancing: how far each routing bias moves per optimizer step.
    routing_bias_speed: float = 1e-3
    mtp_loss_weight: float = option(
        0.0,
        "Weight of DeepSeek-V3's multi-token-prediction loss (it used 0.3, then 0.1); "
        "0 skips the MTP layers' forward and exports them unchanged.",
    )
    optimizer: MuonConfig = field(default_factory=MuonConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    checkpoint_dir: Path | None = option(
        None,
        "DCP checkpoints; resumes from the latest one here (env: CSTACK_TRAIN_CHECKPOINT_DIR).",
    )
    checkpoint_every: int = option(0, "Steps between checkpoints (0: only at the end).")
    export_dir: Path | None = option(None, "Write HF-format weights for serving at the end.")
    log_every: int = 1
    metrics_port: int | None = option(
        None,
        "Serve Prometheus metrics from rank 0 on this port (env: CSTACK_TRAINER_METRICS_PORT).",
    )

    def model_config(self) -> ModelConfig:
        if self.model_path is not None:
            return ModelConfig.from_pretrained(self.model_path)
        if self.model is None:
            raise ValueError("either model_path or model must be set")
        return self.model

    def validate(self) -> None:
        """Everything checkable without processes; raises with the constraint's name."""
        if self.model_path is not None and not (self.model_path / "config.json").is_file():
            raise ValueError(f"{self.model_path} is not a model directory (no config.json)")
        if self.data_path is not None and not self.data_path.is_file():
            raise ValueError(f"data file {self.data_path} does not exist")
        if self.batch_size < 1 or self.seq_len < 1 or self.steps < 0:
            raise ValueError("batch_size and seq_len must be >= 1 and steps >= 0")
        if self.mtp_loss_weight < 0:
            raise ValueError("mtp_loss_weight must be >= 0")
        self.parallel.validate(self.model_config().n_routed_experts, self.batch_size, self.seq_len)

    def to_json(self) -> str:
        return json.dumps(_encode(self))

    @classmethod
    def from_json(cls, text: str) -> TrainerConfig:
        data = json.loads(text)
        model = data.pop("model")
        parallel = data.pop("parallel")
        optimizer = data.pop("optimizer")
        ns = optimizer.pop("newton_schulz")
        if isinstance(ns["schedule"], list):
            ns["schedule"] = tuple(tuple(c) for c in ns["schedule"])
        if "gram_restarts" in ns:
            ns["gram_restarts"] = tuple(ns["gram_restarts"])
        optimizer["adamw_betas"] = tuple(optimizer["adamw_betas"])
        for key in ("model_path", "data_path", "checkpoint_dir", "export_dir"):
            if data[key] is not None:
                data[key] = Path(data[key])
        return cls(
            **data,
            model=None if model is None else ModelConfig(**model),
            optimizer=MuonConfig(**optimizer, newton_schulz=NewtonSchulzConfig(**ns)),
            parallel=ParallelConfig(**parallel),
        )


def _encode(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _encode(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, tuple | list):
        return [_encode(v) for v in value]
    return value
