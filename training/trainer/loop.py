"""The training loop: sharded model, Muon, loss hook, clipping, checkpoints, metrics.

One ``Trainer`` per rank (under torchrun). Each step every rank builds the same global
batch (training.components.data), keeps its own samples (data-parallel rank) and sequence chunk
(context-parallel rank), runs the loss hook (training.components.losses) and backpropagates its
share of the global token mean; reductions sum (``parallelize``), so gradients equal a
single process's on the whole batch.
"""

from __future__ import annotations

import random
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist
from torch import Tensor

from training.components.checkpoint import (
    export_hf,
    full_state,
    latest_checkpoint,
    load_checkpoint,
    save_checkpoint,
)
from training.components.data import RandomTokens, TokenStream
from training.components.losses import LossFn, cross_entropy_loss, mtp_cross_entropy, mtp_inputs
from training.components.metrics import serve_metrics, trainer_metrics
from training.distributed.mesh import Meshes, build_meshes
from training.models.deepseek_v3.hf_io import hf_tensors, wrapper_tensors
from training.models.deepseek_v3.model import DeepseekV3Model
from training.models.deepseek_v3.moe import update_routing_bias
from training.models.deepseek_v3.parallelize import parallelize, reduce_expert_gradients
from training.models.deepseek_v3.qk_clip import qk_clip, take_max_logits
from training.optim.muon import build_optimizer
from training.trainer.config import TrainerConfig


@dataclass
class StepStats:
    step: int
    loss: float
    tokens: int
    seconds: float
    optimizer_seconds: float
    grad_norm: float
    #: Largest attention logit of the step (before QK-clip) and heads QK-clip rescaled.
    max_logit: float
    clipped_heads: int
    #: The MTP layers' cross entropy, averaged over depths (None: MTP loss off).
    mtp_loss: float | None = None
    #: What the loss hook reported besides its loss (``LossTerms.metrics``), each summed
    #: over every rank's tokens.
    loss_metrics: dict[str, float] = field(default_factory=dict)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)


class Trainer:
    """``Trainer(config, loss_fn).fit()`` for supervised runs; RL drives the steps itself.

    RL objectives plug in as the loss hook (training.components.losses): every rank calls
    ``train_step(batch)`` with the same *global* batch, a dict of ``[batch, seq]`` tensors
    (``input_ids``, ``labels`` shifted with -100 where no loss applies, and any per-token
    fields the hook reads, e.g. ``advantages``, ``old_logprobs``, ``ref_logprobs``); the
    trainer cuts out this rank's samples and sequence chunk and hands them to the hook.
    ``export(path)`` then writes HF weights for serving, ``save()`` a DCP checkpoint.
    """

    def __init__(self, config: TrainerConfig, loss_fn: LossFn = cross_entropy_loss) -> None:
        if not dist.is_initialized():
            raise RuntimeError("Trainer needs torch.distributed initialised (run under torchrun)")
        config.validate()
        self.config = config
        self.loss_fn = loss_fn
        self.device = torch.device(
            f"cuda:{torch.cuda.current_device()}" if torch.cuda.is_available() else "cpu"
        )
        self.rank = dist.get_rank()
        seed_everything(config.seed)
        self.meshes: Meshes = build_meshes(config.parallel, self.device.type)
        if config.model_path is not None:
            model = DeepseekV3Model.from_pretrained(config.model_path)
        else:
            model = DeepseekV3Model(config.model_config())
            model.init_weights(config.seed)
        # The loaded model's: it holds only the MTP layers the checkpoint has.
        self.model_config = model.config
        # MTP depths the loss trains; 0 runs no MTP forward.
        self.mtp_depths = (
            self.model_config.num_nextn_predict_layers if config.mtp_loss_weight else 0
        )
        if config.mtp_loss_weight and not self.mtp_depths:
            raise ValueError("mtp_loss_weight > 0 needs a model with MTP layers")
        self.model = parallelize(model.to(self.device), self.meshes)
        self.optimizer = build_optimizer(self.model, config.optimizer)
        vocab = self.model_config.vocab_size
        self.data = (
            TokenStream.from_jsonl(config.data_path, config.model_path, vocab, config.seed)
            if config.data_path is not None
            else RandomTokens(vocab, config.seed)
        )
        self.step = 0
        # Per layer and head, the last step's largest attention logit (QK-clip's input).
        self.max_logits = torch.zeros(0)
        self.clipped_heads = 0
        # The last forward_backward's MTP cross entropy, averaged over depths.
        self.mtp_loss: float | None = None
        self.loss_metrics: dict[str, float] = {}
        resume = latest_checkpoint(config.checkpoint_dir)
        if resume is not None:
            self.step = load_checkpoint(resume, self.model, self.optimizer)
            self._log(f"resumed from {resume} at step {self.step}")
        if config.metrics_port is not None and self.rank == 0:
            serve_metrics(config.metrics_port)

    # -- one step -------------------------------------------------------------------

    def local_batch(self, batch: Mapping[str, Tensor]) -> dict[str, Tensor]:
        """This rank's samples and sequence chunk; adds global ``positions``."""
        parallel = self.config.parallel
        input_ids = batch["input_ids"]
        batch_size, seq_len = input_ids.shape
        per_rank = batch_size // parallel.data_parallel
        first = self.meshes.dp_rank * per_rank
        positions = torch.arange(seq_len).expand(batch_size, seq_len)
        cp_size = self.meshes.context.size(1)
        chunk = seq_len // cp_size
        offset = self.meshes.context.get_local_rank("cp") * chunk
        out: dict[str, Tensor] = {}
        for key, value in {**batch, "positions": positions}.items():
            value = value[first : first + per_rank]
            if value.dim() >= 2 and value.shape[1] == seq_len:
                value = value[:, offset : offset + chunk]
            out[key] = value.to(self.device)
        return out

    def forward_backward(self, batch: Mapping[str, Tensor]) -> tuple[float, int]:
        """The loss hook's loss (global token mean) and global token count; gradients
        accumulate. With MTP on, the objective adds ``mtp_loss_weight`` times the MTP
        layers' cross entropy (each depth's global token mean, averaged over depths), as
        DeepSeek-V3's does; that is kept in ``self.mtp_loss``."""
        depths = self.mtp_depths
        if depths:
            batch = {**batch, **mtp_inputs(batch["input_ids"], batch["labels"], depths)}
        local = self.local_batch(batch)
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.config.bf16):
            if depths:
                logits, mtp_logits = self.model(
                    local["input_ids"], local["positions"], local["mtp_input_ids"]
                )
            else:
                logits = self.model(local["input_ids"], local["positions"])
        terms = self.loss_fn(logits, local)
        mtp_terms = mtp_cross_entropy(mtp_logits, local) if depths else []
        # Token counts of the main loss and of each depth, summed over ranks in one call.
        tokens = torch.stack([t.tokens.detach() for t in (terms, *mtp_terms)]).to(torch.float64)
        dist.all_reduce(tokens)
        counts = tokens.clamp(min=1).to(terms.loss_sum.dtype)
        loss = terms.loss_sum / counts[0]
        objective, mtp_loss = loss, loss.new_zeros(())
        if depths:
            per_depth = [t.loss_sum / n for t, n in zip(mtp_terms, counts[1:], strict=True)]
            mtp_loss = torch.stack(per_depth).mean()
            objective = loss + self.config.mtp_loss_weight * mtp_loss
        objective.backward()
        reduce_expert_gradients(self.model, self.meshes)
        # The hook's own metrics ride along (every rank's hook reports the same names).
        names = sorted(terms.metrics)
        extra = [terms.metrics[name].detach().to(loss.dtype) for name in names]
        reported = torch.stack([loss.detach(), mtp_loss.detach(), *extra])
        dist.all_reduce(reported)
        self.mtp_loss = float(reported[1]) if depths else None
        self.loss_metrics = dict(zip(names, reported[2:].tolist(), strict=True))
        return float(reported[0]), int(tokens[0])

    def clip_gradients(self) -> float:
        """Global gradient norm over every parameter, whatever mesh it lives on."""
        total = torch.zeros(1, dtype=torch.float64, device=self.device)
        for param in self.model.parameters():
            if param.grad is None:
                continue
            grad = param.grad
            local = grad.to_local() if hasattr(grad, "to_local") else grad
            replicas = 1
            for mesh_dim, placement in enumerate(getattr(grad, "placements", ())):
                if placement.is_replicate():
                    replicas *= grad.device_mesh.size(mesh_dim)  # type: ignore[attr-defined]
            total += local.double().pow(2).sum() / replicas
        dist.all_reduce(total)
        norm = float(total.sqrt())
        if self.config.grad_clip > 0 and norm > self.config.grad_clip:
            scale = self.config.grad_clip / (norm + 1e-6)
            for param in self.model.parameters():
                if param.grad is not None:
                    grad = param.grad
                    (grad.to_local() if hasattr(grad, "to_local") else grad).mul_(scale)
        return norm

    def optimizer_step(self) -> tuple[float, float]:
        """Clip, step, QK-clip, balance routing; returns (grad norm, optimizer seconds)."""
        norm = self.clip_gradients()
        started = time.perf_counter()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        seconds = time.perf_counter() - started
        # Every rank saw other tokens: the max over all of them, so all scale alike.
        self.max_logits = take_max_logits(self.model, dist.group.WORLD)
        tau = self.config.optimizer.qk_clip_tau
        self.clipped_heads = qk_clip(self.model, self.max_logits, tau) if tau > 0 else 0
        update_routing_bias(self.model, self.config.routing_bias_speed, dist.group.WORLD)
        self.step += 1
        return norm, seconds

    def train_step(self, batch: Mapping[str, Tensor]) -> StepStats:
        started = time.perf_counter()
        loss, tokens = self.forward_backward(batch)
        norm, optimizer_seconds = self.optimizer_step()
        seconds = time.perf_counter() - started
        max_logit = float(self.max_logits.max())
        stats = StepStats(
            self.step,
            loss,
            tokens,
            seconds,
            optimizer_seconds,
            norm,
            max_logit,
            self.clipped_heads,
            self.mtp_loss,
            self.loss_metrics,
        )
        if self.rank == 0:
            metrics = trainer_metrics()
            metrics.record(self.step, seconds, loss, tokens, time.time())
            metrics.record_attention(max_logit, self.clipped_heads)
        return stats

    # -- the loop -------------------------------------------------------------------

    def fit(self) -> list[StepStats]:
        cfg = self.config
        history: list[StepStats] = []
        while self.step < cfg.steps:
            stats = self.train_step(self.data.batch(self.step, cfg.batch_size, cfg.seq_len))
            history.append(stats)
            if cfg.log_every and stats.step % cfg.log_every == 0:
                mtp = "" if stats.mtp_loss is None else f" | mtp loss {stats.mtp_loss:.4f}"
                self._log(
                    f"step {stats.step}/{cfg.steps} | loss {stats.loss:.4f}{mtp} | "
                    f"tokens/s {stats.tokens / stats.seconds:,.0f} | "
                    f"optimizer {stats.optimizer_seconds * 1e3:.1f} ms | "
                    f"grad norm {stats.grad_norm:.3f} | max logit {stats.max_logit:.1f} "
                    f"({stats.clipped_heads} heads clipped) | step {stats.seconds:.2f} s"
                )
            if (
                cfg.checkpoint_dir
                and cfg.checkpoint_every
                and stats.step % cfg.checkpoint_every == 0
            ):
                self.save()
        saved_last = cfg.checkpoint_every and self.step % cfg.checkpoint_every == 0
        if cfg.checkpoint_dir and history and not saved_last:
            self.save()
        if cfg.export_dir is not None:
            self.export(cfg.export_dir)
        return history

    def save(self) -> None:
        assert self.config.checkpoint_dir is not None
        path = save_checkpoint(self.config.checkpoint_dir, self.step, self.model, self.optimizer)
        self._log(f"checkpoint saved to {path}")

    def export(self, out: Path) -> None:
        export_hf(self.model, self.model_config, out, self.config.model_path)
        self._log(f"HF weights for serving written to {out}")

    def hf_weights(self) -> dict[str, Tensor]:
        """The tensors ``export`` writes, in memory (all ranks must call; whole on each)."""
        source = self.config.model_path
        carried = wrapper_tensors(source, self.model_config) if source is not None else None
        return hf_tensors(full_state(self.model), self.model_config, carried)

    def _log(self, message: str) -> None:
        if self.rank == 0:
            print(message, flush=True)
